"""Pinned reference numbers: a few dozen runs of a few steps each (every group, every probe that
is off by default, a translation with BLEU, a language model, the SMD network), whose key
numbers are kept in tests/data/reference_numbers.json. tests/test_reference_numbers.py runs
them again and fails when a number moved, so that no change moves one unnoticed.

    python scripts/reference_numbers.py           # run them, print what differs from the file
    python scripts/reference_numbers.py --write   # run them, rewrite the file
    python scripts/reference_numbers.py --only NAME --write   # re-record one run, keep the others

A commit that moves a number rewrites the file in the same commit and says why.

The comparison of a run is exact where the torch version and the CPU model are those its
numbers were recorded on: the file's `recorded_on`, or the run's own where it was re-recorded on
another machine. Elsewhere float32 rounds differently, and a few training steps make more of
that in some numbers than in others, so it allows a relative AT_INIT_TOLERANCE in the numbers
measured before any update and TRAINED_TOLERANCE in the others, and QUANTITY_TOLERANCE where a
quantity's own computation needs another (a difference of near-equal outputs, a rounding
residual). So a contributor on any machine re-records the runs their change moves with
`--only NAME --write`: those entries keep the machine they were recorded on, and the others
stay as recorded.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import platform
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional

ROOT = Path(__file__).resolve().parents[1]
PINNED = ROOT / "tests" / "data" / "reference_numbers.json"
REWRITE = "python scripts/reference_numbers.py --write"
# Measured with the same runs on two threads instead of one (other reduction orders, as on
# another CPU): the numbers at init moved by less than 1e-6, the others by up to 8e-4 (the
# largest attention logit; the translation's gradient norms after 40 steps).
AT_INIT_TOLERANCE = 1e-5
TRAINED_TOLERANCE = 1e-2
# Where a number is the difference of two near-equal ones (a layer's loss increase, a sum of
# signed parts), another CPU's rounding is relative to its parts, not to it.
ABSOLUTE_TOLERANCE = 1e-9
# Each quantity's own tolerance off the machine of record, where the two above do not fit how it
# is computed. Measured spread between instruction sets, on this project's AMD EPYC (Zen 4,
# torch 2.13.0) against the AVX2 record, 2026-12-07: its AVX-512 kernels, and its default
# (ATEN_CPU_CAPABILITY=default) ones; and on an Intel Xeon (AVX-512), 2026-12-06.
# - output_change, input_change: |F(x, W) - F(x, W + delta)|^2 and its per-layer kin, a
#   difference of two near-equal outputs whose rounding is relative to the outputs: 1.1e-5 of
#   itself at step 0 (default kernels), 3.2e-5 (Intel), against the 1e-5 at init; 1e-3 keeps a
#   30x margin and still tells a wrong formula, which moves it by far more than 0.1%.
# - grad_scaling_error: Property 2's residual, |k grad L(k w) - grad L(w)| / |grad L(w)|, is
#   rounding itself (4.6e-6 here, 2.6% apart between kernels): held below 1e-4, where a
#   gradient that is not scale-invariant gives 1e-2 and more.
QUANTITY_TOLERANCE = {"output_change": ("relative", 1e-3), "input_change": ("relative", 1e-3),
                      "grad_scaling_error": ("below", 1e-4)}
# Keys of numbers measured before any update: summary.json's (the loss of step 1 is computed
# on theta_0) and the step-0 rows' sums (AT_STEP_0); and the lr column, the schedule's
# arithmetic, which no update reaches.
AT_INIT = ("summary:constants", "summary:chance_loss", "summary:parameters", "summary:data", "summary:theory",
           "summary:features_init_norm", "summary:first_loss", "metrics.csv:lr:")
AT_STEP_0 = "sum at step 0"

# The settings of every run, spelled out here rather than taken from the tests' TINY, so that the
# pinned numbers move when the code does and not when another test's settings do. One thread:
# a reduction splits its work by thread count, and with it its rounding.
BASE = ["model.d_model=16", "model.ffn_dim=32", "model.n_heads=2", "depth=2", "train.steps=6",
        "train.batch_size=8", "task.eval_batch_size=16", "task.probe_batch_size=4", "task.seq_len=6",
        "probe.first_steps=2", "probe.every=3", "train.eval_every=3", "train.warmup_steps=3",
        "train.threads=1", "train.device=cpu", "seed=0"]
# N != M, so that a constant computed for the wrong stack shows.
ENCODER_DECODER = ["decoder_depth=3"]
LM = ["task=lm", "model.arch=decoder_only", "task.vocab_size=160", "task.seq_len=8"]
# The corpus of tests/corpus.py; {corpus} is its folder, written afresh by `measure_all`.
TRANSLATION = ["task=translation", "task.path={corpus}", "task.train_split=train", "task.valid_split=val",
               "task.test_split=test_2016_flickr", "task.vocab_size=200", "task.eval_batch_size=8",
               "task.max_len=30", "train.max_tokens=120", "model.dropout=0.0"]
# Groups whose init rule has a single-stack form of its constants (DeepNorm's, Sub-LN's
# gamma, Fixup's L, Admin's omegas), run decoder-only as well.
SINGLE_STACK_TOO = ("deepnorm", "subln", "fixup", "admin", "admin_closed_form")
# Mix-LN's bottom floor(a L) layers are Post-LN: at L = 4, a = 0.25 makes one of them.
GROUP_EXTRA = {"mix_ln": ["depth=4"]}


def _group_names() -> List[str]:
    from stabexp.paths import conf_dir

    return sorted(p.stem for p in (conf_dir() / "group").glob("*.yaml"))


def _encoder_decoder(group: str) -> bool:
    from omegaconf import OmegaConf

    from stabexp import plugins
    from stabexp.paths import conf_dir

    return plugins.placement(OmegaConf.load(conf_dir() / "group" / f"{group}.yaml").residual).encoder_decoder


def runs() -> Dict[str, List[str]]:
    """Run name -> its overrides on top of BASE."""
    found: Dict[str, List[str]] = {}
    for group in _group_names():
        extra = GROUP_EXTRA.get(group, [])
        if _encoder_decoder(group):
            found[f"group/{group}"] = [f"group={group}", *ENCODER_DECODER, *extra]
        if not _encoder_decoder(group) or group in SINGLE_STACK_TOO:
            found[f"group/{group}/lm"] = [f"group={group}", *LM, *extra]
    found.update({
        "probe/at_init": ["group=postln", *ENCODER_DECODER, "probe.at_init=true", "probe.perturbation_draws=2",
                          "probe.grad_batches=2"],
        "probe/update_bound": ["group=deepnorm", *ENCODER_DECODER, "probe.update_bound=true"],
        "probe/update_bound/lm": ["group=postln_init", *LM, "probe.update_bound=true"],
        "probe/dependency": ["group=admin", *ENCODER_DECODER, "probe.dependency=true"],
        "probe/dependency/rmsnorm": ["group=deepnorm", *ENCODER_DECODER, "model.norm=rmsnorm",
                                     "probe.dependency=true"],
        "probe/dependency/postln": ["group=postln", *ENCODER_DECODER, "probe.dependency=true"],
        "probe/layer_importance": ["group=preln", *ENCODER_DECODER, "probe.layer_importance=true"],
        "probe/attention_mixing": ["group=postln", *ENCODER_DECODER, "probe.attention_mixing=true"],
        "probe/init_distance": ["group=postln_init", *ENCODER_DECODER, "probe.init_distance=true"],
        "probe/weights": ["group=preln", *ENCODER_DECODER, "optim=adamw", "probe.weights=true"],
        # The SMD preset's network and optimisers (conf/experiment/smd.yaml), a few steps.
        "smd/sgdm": ["model=normmlp", "task=teacher", "depth=3", "optim=sgdm", "optim.weight_decay=0.01",
                     "train.lr=0.1", "train.schedule=constant", "probe.weights=true"],
        "smd/adamw": ["model=normmlp", "task=teacher", "depth=3", "optim=adamw", "optim.weight_decay=0.02",
                      "train.lr=0.01", "train.schedule=constant", "probe.weights=true"],
        # Enough steps for the test BLEU to be more than 0.
        "task/translation": ["group=preln", *ENCODER_DECODER, *TRANSLATION, "train.steps=40",
                             "train.eval_every=20", "train.lr=3e-3"],
        "task/lm": ["group=preln", *LM, "train.steps=12"],
        "task/lm/encoder_only": ["group=preln", *LM, "model.arch=encoder_only"],
        "task/reverse": ["group=postln_warmup", *ENCODER_DECODER, "task=reverse"],
        # What no group of conf/group names: an init rule, a placement, a schedule and the
        # schedule's other forms.
        "init/ds_init_code": ["group=ds_init", *ENCODER_DECODER, "group.init=ds_init_code"],
        "placement/normformer_fairseq": ["group=normformer", *ENCODER_DECODER,
                                         "group.residual=normformer_fairseq"],
        "schedule/warmup_linear_decay": ["group=postln_warmup", *ENCODER_DECODER,
                                         "train.schedule=warmup_linear_decay"],
        "schedule/warmup_init_lr": ["group=postln_warmup", *ENCODER_DECODER, "train.warmup_init_lr=1e-4"],
        "schedule/no_warmup_steps": ["group=postln_warmup", *ENCODER_DECODER, "train.warmup_steps=0"],
    })
    return found


# --- measuring -----------------------------------------------------------------------------

def compose(overrides: Iterable[str]):
    """The config `stabexp run` would run with BASE and these overrides."""
    from stabexp.compose import compose as compose_config

    return compose_config([*BASE, *overrides])


@contextmanager
def private_state(data_dir: Path) -> Iterator[None]:
    """The runs read and write data (subword models) under data_dir, never the user's cache nor
    another test's; torch's thread count, which a run sets, is given back after them."""
    import torch

    before, threads = os.environ.get("STABEXP_DATA"), torch.get_num_threads()
    os.environ["STABEXP_DATA"] = str(data_dir)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if before is None:
            os.environ.pop("STABEXP_DATA", None)
        else:
            os.environ["STABEXP_DATA"] = before


def write_corpus(folder: Path) -> Path:
    """The small parallel corpus the tests translate (tests/corpus.py), written into folder."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from corpus import write_corpus as write
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return write(folder)


def measure(name: str, overrides: List[str], work: Path) -> Dict[str, float]:
    """Run `name` into work/runs/<name> and return its key numbers."""
    from stabexp.train.trainer import train

    out_dir = work / "runs" / name
    corpus = work / "corpus"
    train(compose([o.replace("{corpus}", str(corpus)) for o in overrides]), out_dir)
    return key_numbers(out_dir)


def measure_all(work: Path, names: Optional[Iterable[str]] = None,
                extra: Iterable[str] = ()) -> Dict[str, Dict[str, float]]:
    """The key numbers of every run (or of `names`, with `extra` overrides after each run's own),
    run under `work`."""
    work = Path(work)
    write_corpus(work / "corpus")
    every = runs()
    with private_state(work / "data"):
        return {name: measure(name, [*every[name], *extra], work) for name in (names or every)}


def key_numbers(out_dir: Path) -> Dict[str, float]:
    """What is pinned of a run: every number of summary.json but the wall clock's, the memory's
    and the config's own, the sums of each numeric column of each CSV file (so that a change in
    any cell shows), and a few single cells a reader looks at first."""
    numbers = summary_numbers(json.loads((out_dir / "summary.json").read_text()))
    for path in sorted(out_dir.glob("*.csv")):
        rows = _read_rows(path)
        numbers.update(column_sums(path.name, rows))
        numbers.update(last_cells(path.name, rows))
    return numbers


# Keys of summary.json that repeat the config rather than measure anything.
CONFIG_ECHOES = ("depth", "decoder_depth", "seed", "d_model", "steps", "optim", "threads", "world_size")


def summary_numbers(summary: Dict) -> Dict[str, float]:
    from stabexp.train.files import WALL_CLOCK

    flat: Dict[str, float] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(f"{prefix}[{i}]", item)
        elif isinstance(value, (int, float)):  # bool too: scale-invariance flags, qk_norm
            flat[prefix] = value

    for key, value in summary.items():
        if key not in WALL_CLOCK and key not in CONFIG_ECHOES:
            walk(f"summary:{key}", value)
    return flat


def _read_rows(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _number(cell: str) -> Optional[float]:
    """A CSV cell as written (repr of a float, or True / False); None for an empty cell."""
    if cell == "":
        return None
    if cell in ("True", "False"):
        return float(cell == "True")
    return float(cell)


def _numeric_columns(rows: List[Dict[str, str]]) -> List[str]:
    from stabexp.train.files import WALL_CLOCK

    def numeric(column: str) -> bool:
        try:
            [_number(row[column]) for row in rows]
        except ValueError:  # stack, sublayer, param
            return False
        return True

    return [c for c in (rows[0] if rows else {}) if c not in WALL_CLOCK and numeric(c)]


def column_sums(file: str, rows: List[Dict[str, str]]) -> Dict[str, float]:
    """Each numeric column's exactly rounded sum over its finite cells (math.fsum: independent
    of the order and of numpy's summation), the same over the step-0 rows alone, and how many
    of the file's numeric cells are empty or not finite. A column with no number at all (a probe
    that is off) is left out."""
    sums: Dict[str, float] = {}
    missing = 0
    for column in _numeric_columns(rows):
        values = [_number(row[column]) for row in rows]
        missing += sum(1 for v in values if v is None or not math.isfinite(v))
        at_step_0 = [v for v, row in zip(values, rows) if row.get("step") == "0"]
        for label, kept in (("sum", values), (AT_STEP_0, at_step_0)):
            finite = [v for v in kept if v is not None and math.isfinite(v)]
            if finite:
                sums[f"{file}:{column}:{label}"] = math.fsum(finite)
    if sums:
        sums[f"{file}:empty or not finite"] = missing
    return sums


def last_cells(file: str, rows: List[Dict[str, str]]) -> Dict[str, float]:
    """metrics.csv: the model update at the last step that measured it; layers.csv: the
    gradient norm, LN input norm and stream norm of the bottom sublayer at the last probe step."""
    if file == "metrics.csv":
        probed = [row for row in rows if row.get("model_update")]
        return {f"{file}:model_update:step={probed[-1]['step']}": float(probed[-1]["model_update"])} if probed else {}
    if file == "layers.csv":
        sublayers = [row for row in rows if not row.get("param")]
        if not sublayers:
            return {}
        last = sublayers[-1]["step"]
        first = next(row for row in sublayers if row["step"] == last)
        where = f"step={last},{first['stack']},{first['layer']},{first['sublayer']}"
        return {f"{file}:{column}:{where}": float(first[column])
                for column in ("grad_norm", "ln_input_norm", "stream_norm") if first.get(column)}
    return {}


# --- the environment and the comparison ----------------------------------------------------

def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_id() -> str:
    """The CPU's family, model and stepping (/proc/cpuinfo): one model name ("AMD EPYC") covers
    generations whose kernels round differently."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines()[:30]
                      if ":" in line)
    except OSError:
        return ""
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return " ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)


def environment() -> Dict[str, str]:
    """What the numbers depend on beyond the code: the exact mode needs torch, the CPU and the
    instruction set torch's kernels take on it alike; the rest is for a reader working out why
    they moved."""
    import numpy
    import sentencepiece
    import torch

    return {"torch": torch.__version__, "cpu": cpu_model(), "cpu_id": cpu_id(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "numpy": numpy.__version__, "sentencepiece": sentencepiece.__version__,
            "platform": platform.platform()}


# What makes two machines one for the exact comparison; a record without one of them (written
# before it was kept) is compared within the tolerances.
SAME_MACHINE = ("torch", "cpu", "cpu_id", "cpu_capability")


def same_machine(recorded: Dict[str, str], now: Dict[str, str]) -> bool:
    return all(recorded.get(key) == now[key] for key in SAME_MACHINE)


def mode_line(recorded: Dict[str, str], now: Dict[str, str]) -> str:
    def machine(env):
        return f"torch {env.get('torch')} on {env.get('cpu')} ({env.get('cpu_id')}, {env.get('cpu_capability')})"
    if same_machine(recorded, now):
        return f"exact comparison ({machine(now)}, as recorded)"
    return (f"comparison within a relative {AT_INIT_TOLERANCE:g} at init and {TRAINED_TOLERANCE:g} after "
            f"updates (recorded with {machine(recorded)}, measured with {machine(now)}); exact on the "
            "machine of record")


def at_init(key: str) -> bool:
    return key.startswith(AT_INIT) or key.endswith(AT_STEP_0)


@dataclass(frozen=True)
class Difference:
    run: str
    key: str
    recorded: object  # None: not in the file
    measured: object  # None: no longer measured

    def line(self) -> str:
        return f"{self.run}  {self.key}: recorded {self.recorded!r}, measured {self.measured!r}"


def quantity(key: str) -> str:
    """The measure a pinned key holds: "metrics.csv:output_change:sum at step 0" -> output_change,
    "summary:grad_scaling_error" -> grad_scaling_error."""
    parts = key.split(":")
    return parts[1].split(".")[0] if len(parts) > 1 else parts[0]


def same(key: str, recorded, measured, exact: bool) -> bool:
    if isinstance(recorded, float) and isinstance(measured, (int, float)) and not isinstance(measured, bool):
        if exact:
            return recorded == measured or (math.isnan(recorded) and math.isnan(measured))
        kind, tolerance = QUANTITY_TOLERANCE.get(quantity(key), ("relative", None))
        if kind == "below":
            return recorded < tolerance and measured < tolerance
        if tolerance is None:
            tolerance = AT_INIT_TOLERANCE if at_init(key) else TRAINED_TOLERANCE
        else:
            tolerance = max(tolerance, AT_INIT_TOLERANCE if at_init(key) else TRAINED_TOLERANCE)
        return math.isclose(recorded, measured, rel_tol=tolerance, abs_tol=ABSOLUTE_TOLERANCE)
    return type(recorded) is type(measured) and recorded == measured


def differences(recorded: Dict[str, Dict], measured: Dict[str, Dict], exact) -> List[Difference]:
    """Every key of every run whose number differs, or that one side lacks. `exact`: a bool for
    every run, or a function of the run's name (exact_runs)."""
    found = []
    for run in sorted(set(recorded) | set(measured)):
        a, b = recorded.get(run, {}), measured.get(run, {})
        run_exact = exact(run) if callable(exact) else exact
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or not same(key, a[key], b[key], run_exact):
                found.append(Difference(run, key, a.get(key), b.get(key)))
    return found


def load(path: Path = PINNED) -> Dict:
    return json.loads(path.read_text())


def recorded_on(pinned: Dict, run: str) -> Dict[str, str]:
    """The machine a run's numbers were recorded on: its own entry's, else the file's."""
    return pinned["runs"].get(run, {}).get("recorded_on") or pinned["recorded_on"]


def exact_runs(pinned: Dict, now: Dict[str, str]):
    """Per run: compared exactly (this is the machine its numbers were recorded on), or not."""
    return lambda run: same_machine(recorded_on(pinned, run), now)


def pinned_numbers(pinned: Dict) -> Dict[str, Dict]:
    """Run -> its numbers, with the run's overrides among them, so that a changed run
    definition counts as a difference too."""
    return {name: {"overrides": run["overrides"], **run["numbers"]} for name, run in pinned["runs"].items()}


def with_overrides(measured: Dict[str, Dict]) -> Dict[str, Dict]:
    every = runs()
    return {name: {"overrides": every.get(name), **numbers} for name, numbers in measured.items()}


def report(found: List[Difference], mode: str, limit: Optional[int] = None) -> str:
    shown = found if limit is None else found[:limit]
    lines = [f"{len(found)} pinned reference numbers differ, {mode}:", *("  " + d.line() for d in shown)]
    if len(found) > len(shown):
        lines.append(f"  ... and {len(found) - len(shown)} more")
    lines.append(f"If the change is meant to move them: `{REWRITE}`, and say why in the commit that "
                 "changes the file.")
    return "\n".join(lines)


def write(measured: Dict[str, Dict[str, float]], path: Path = PINNED) -> None:
    every = runs()
    pinned = {"recorded_on": {**environment(), "date": datetime.date.today().isoformat(), "command": REWRITE},
              "runs": {name: {"overrides": every[name], "numbers": numbers} for name, numbers in measured.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pinned, indent=1) + "\n")


def rewrite_runs(measured: Dict[str, Dict[str, float]], path: Path = PINNED) -> None:
    """Re-record some runs in the file, the others kept as recorded. On another machine than the
    file's, each re-recorded entry keeps the machine it was recorded on (its own `recorded_on`),
    so that it is compared exactly there and within the tolerances elsewhere."""
    pinned, now = load(path), environment()
    own = (None if same_machine(pinned["recorded_on"], now) else
           {**now, "date": datetime.date.today().isoformat(), "command": f"{REWRITE} --only NAME"})
    every = runs()
    pinned["runs"].update({name: {"overrides": every[name], "numbers": numbers, **({"recorded_on": own} if own else {})}
                           for name, numbers in measured.items()})
    pinned["runs"] = dict(sorted(pinned["runs"].items()))
    path.write_text(json.dumps(pinned, indent=1) + "\n")


def main(argv: List[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python scripts/reference_numbers.py",
                                     description="Run the pinned reference runs and compare, or rewrite the file.")
    parser.add_argument("--write", action="store_true", help="rewrite the file with the numbers measured")
    parser.add_argument("--only", metavar="NAME[,NAME...]",
                        help="these runs only (compared, or with --write re-recorded, the others kept)")
    args = parser.parse_args(argv)
    every = runs()
    names = args.only.split(",") if args.only else list(every)
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"--only {unknown[0]} is not a reference run: one of {', '.join(every)}")
    with tempfile.TemporaryDirectory() as work:
        measured = measure_all(Path(work), names)
    if args.write:
        rewrite_runs(measured) if args.only else write(measured)
        print(f"wrote {sum(map(len, measured.values()))} numbers of {len(measured)} runs to "
              f"{PINNED.relative_to(ROOT)}")
        return 0
    pinned = load()
    now = environment()
    recorded = {name: numbers for name, numbers in pinned_numbers(pinned).items() if name in names}
    found = differences(recorded, with_overrides(measured), exact_runs(pinned, now))
    own = sorted(n for n in names if pinned["runs"].get(n, {}).get("recorded_on"))
    mode = mode_line(pinned["recorded_on"], now) + (f"; {len(own)} runs recorded on machines of their own, each "
                                                    "compared exactly only there" if own else "")
    print(report(found, mode) if found else f"all {sum(map(len, measured.values()))} numbers as pinned ({mode})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
