"""The paper-scale claims and the GPU path in one command, inside a wall-time budget.

    python scripts/paper_scale.py --device cuda --out DIR [--budget 420] [--data DIR]
    python scripts/paper_scale.py --device cpu --quick --out DIR --override task=translation ...

Written for one GPU of the size of an H200 (139 GiB, 16 cores); the parts, in this order:

1. throughput: `stabexp bench` of one d = 512, 6L-6L run (b:postln, probes off) against a
   plain torch.nn.Transformer loop of the same shape (a) on Multi30k batches of 4096 tokens, in
   fp32 and in bf16: steps/s, target tokens/s and model FLOPs utilisation. First, while nothing
   else runs on the GPU.
2. gpu_check: scripts/gpu_check.py without its own bench (fp32 and bf16, DDP and FSDP on one
   rank, `stabexp plan` against the measured peak).
3. The claims that show at the papers' width or protocol, three seeds each, every preset a
   packed sweep (as many jobs at once as the GPU's memory holds and its cores feed):
   DeepNet Fig. 4 (deepnet_early_paper: 18L-18L, d = 512, 30 updates, the three Post-LN groups),
   Fig. 5 (deepnet_depth_paper: the paper's 64-128-2 models at 6L-100L, updates 1-30),
   Admin Theorem 2 by Transformer-Clinic's protocol (admin_clinic model=base: one 100-layer
   encoder at init, d = 512), and Admin's 15 (lr, beta2) settings at the paper's scale
   (admin_grid scale=paper task=multi30k: 6L-6L, d = 512, bf16) for --grid-steps updates
   instead of the paper's 8000, the count this budget allows. Multi30k De-En stands in for
   IWSLT'14 throughout.
Then `stabexp claims OUT/outputs --record OUT/evidence.csv` (the form docs/data keeps) and the
claims table of these runs.

Each part has a share of --budget; time a part leaves unused goes to the parts after it. A part
still running at the end of its time is stopped as a sweep is stopped (SIGTERM: its jobs
checkpoint), and the summary says it was cut and what it had finished; a part that could not
start is listed as not started. Writes into --out (at most 8 files, for a machine that returns
no more): summary.md (every part's table, time and outcome), evidence.csv, bench.json, runs.tar.gz
(the finished runs' CSV and JSON files, no checkpoints) and log.txt (every command's output).

`--device cpu --quick` runs every part at a small size (scale=quick, one seed, one grid setting,
tiny bench) so the command stays runnable without a GPU; tests/test_paper_scale.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

SCRIPTS = Path(__file__).resolve().parent
STOP_GRACE_S = 20.0   # after SIGTERM, for a sweep's jobs to checkpoint, before SIGKILL
CLOSING_S = 25.0      # kept back from the parts for the claims record and the archive
SEEDS = "seed=0,1,2"


@dataclass
class Part:
    name: str
    share: float                                   # of the budget
    what: str                                      # one line for the summary
    commands: Callable[[argparse.Namespace], List[List[str]]]
    preset: Optional[str] = None                   # the preset whose runs it makes (for the summary)
    recipe: Optional[str] = None                   # the claims' name for its runs (claims.measures: NAME_paper at scale=paper)


def stabexp_command(*args: str) -> List[str]:
    return [sys.executable, "-m", "stabexp", *args]


def _translation(args) -> List[str]:
    """Overrides of every Multi30k run: the device, and --override (say, a corpus from disk)."""
    return [f"train.device={args.device}", *args.override]


def _bench(args) -> List[List[str]]:
    size, depth, steps, repeats = ("tiny", "2", "2", "1") if args.quick else ("base", "6", "10", "3")
    overrides = [x for o in args.override if not o.startswith(("task=", "train.max_tokens")) for x in ("--override", o)]
    common = ["bench", "--task", "multi30k", "--sizes", size, "--depths", depth, "--variants", "a,b:postln",
              "--max-tokens", "200" if args.quick else "4096", "--steps", steps, "--repeats", repeats, "--no-memory",
              *overrides]
    return [stabexp_command(*common, "--override", f"train.precision={p}", "--out", str(args.out / f"bench_{p}.json"))
            for p in ("fp32", "bf16")]


def _gpu_check(args) -> List[List[str]]:
    return [[sys.executable, str(SCRIPTS / "gpu_check.py"), "--device", args.device, "--no-bench",
             "--out", str(args.work / "gpu_check"), *(["--quick"] if args.quick else [])]]


def _preset(name: str, *extra: str) -> Callable:
    def commands(args) -> List[List[str]]:
        scale = ["scale=quick", "seed=0"] if args.quick else [SEEDS]
        return [stabexp_command("run", f"experiment={name}", *extra, *scale, *_translation(args))]
    return commands


def _grid(args) -> List[List[str]]:
    if args.quick:  # one of the 15 settings, three groups, one seed
        return [stabexp_command("run", "experiment=admin_grid", "scale=quick", "task=multi30k", "seed=0",
                                "train.lr=5e-3", "optim.betas=[0.9,0.999]", *_translation(args))]
    return [stabexp_command("run", "experiment=admin_grid", "scale=paper", "task=multi30k", SEEDS,
                            f"train.steps={args.grid_steps}", f"train.eval_every={args.grid_steps}",
                            *_translation(args))]


PARTS = (
    Part("throughput", 0.10, "stabexp (b:postln, probes off) against torch.nn.Transformer (a), d = 512, 6L-6L, "
         "Multi30k batches of 4096 tokens, fp32 and bf16", _bench),
    Part("gpu_check", 0.22, "scripts/gpu_check.py: fp32 / bf16, DDP and FSDP on one rank, the plan against the peak",
         _gpu_check),
    Part("deepnet_early_paper", 0.10, "DeepNet Fig. 4 by the paper's protocol, 18L-18L, d = 512, three seeds",
         _preset("deepnet_early_paper"), "deepnet_early_paper", "deepnet_early_paper"),
    Part("deepnet_depth_paper", 0.14, "DeepNet Fig. 5 by the paper's protocol, 6L-100L, three seeds",
         _preset("deepnet_depth_paper"), "deepnet_depth_paper", "deepnet_depth_paper"),
    Part("admin_clinic", 0.07, "Admin Theorem 2, one 100-layer encoder at init, d = 512, three seeds",
         _preset("admin_clinic", "model=base"), "admin_clinic", "admin_clinic"),
    Part("admin_grid", 0.37, "Admin's 15 (lr, beta2) settings, 6L-6L, d = 512, bf16, three seeds", _grid, "admin_grid",
         "admin_grid_paper"),
)


# --- running a part inside its time -------------------------------------------------------

def run_within(command: List[str], seconds: float, log, env: Dict[str, str]) -> str:
    """Run `command` (its output appended to `log`), stopped as a sweep is stopped when it
    outlasts `seconds`: "done", "failed (exit N)" or "cut after N s"."""
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)  # the packed launcher passes it on: its jobs checkpoint
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return f"cut after {seconds:.0f} s"
    return "done" if code == 0 else f"failed (exit {code})"


def packing_lines(log_path: Path, start: int) -> List[str]:
    """The packed launcher's "N job(s) in ...: ..., K job(s) at a time ..." lines written since `start`."""
    with open(log_path, errors="replace") as f:
        f.seek(start)
        return [line.split("] ", 1)[-1].strip() for line in f if "job(s) at a time" in line]


def finished_runs(outputs: Path) -> Dict[str, Dict[str, int]]:
    """Per preset: how many runs under `outputs` completed, diverged, or are unfinished."""
    from stabexp.train.files import read_summary

    counts: Dict[str, Dict[str, int]] = {}
    for summary in outputs.rglob("summary.json"):
        data = read_summary(summary.parent)
        if data is None:  # not a run's summary
            continue
        status = data.get("status") if data.get("status") in ("completed", "diverged") else "unfinished"
        mine = counts.setdefault(str(data.get("experiment")), {"completed": 0, "diverged": 0, "unfinished": 0})
        mine[status] += 1
    return counts


def claims_of(parts: List[Part]) -> List[str]:
    """The ids of the claims that read these parts' runs (the claims registry's own `needs`)."""
    from stabexp.claims import CLAIMS

    recipes = {p.recipe for p in parts if p.recipe}
    return [c.id for c in CLAIMS if recipes & {cells.recipe for cells in c.needs}]


def bench_table(out: Path) -> str:
    from stabexp.bench import format_table

    tables, merged = [], {}
    for precision in ("fp32", "bf16"):
        path = out / f"bench_{precision}.json"
        if path.is_file():
            report = json.loads(path.read_text())
            merged[precision] = report
            tables.append(f"{precision}: " + format_table(report))
            path.unlink()
    if merged:
        (out / "bench.json").write_text(json.dumps(merged, indent=1))
    return "\n\n".join(tables) or "no measurement"


def gpu_check_table(log_text: str) -> str:
    lines = log_text.splitlines()
    start = next((i for i, line in enumerate(lines) if "DeepNorm, tiny width" in line), None)
    if start is None:
        return "no table"
    return "\n".join(line for line in lines[start:] if line.startswith("|") or "DeepNorm, tiny width" in line)


def archive(outputs: Path, target: Path) -> int:
    """The finished and unfinished runs' small files (CSV, JSON, config), no checkpoints; the count."""
    n = 0
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(outputs.rglob("*")):
            if path.is_file() and path.suffix in (".csv", ".json", ".yaml") and "checkpoint" not in path.name:
                tar.add(path, arcname=str(path.relative_to(outputs)))
                n += 1
    return n


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, required=True, help="folder for the at most 8 files it writes")
    parser.add_argument("--budget", type=float, default=420.0, help="wall-clock seconds for everything (default 420)")
    parser.add_argument("--data", type=Path, default=None, help="STABEXP_DATA for the runs (Multi30k, tokenizers)")
    parser.add_argument("--grid-steps", type=int, default=200,
                        help="updates of each of Admin's grid runs (the paper's 8000 do not fit; default 200)")
    parser.add_argument("--quick", action="store_true", help="every part at a small size (for the CPU)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every Multi30k run and the bench (repeatable)")
    parser.add_argument("--parts", default=",".join(p.name for p in PARTS),
                        help=f"comma list of the parts to run, of {', '.join(p.name for p in PARTS)}")
    args = parser.parse_args(argv)
    chosen = [p for p in args.parts.split(",") if p]
    bad = [p for p in chosen if p not in {part.name for part in PARTS}]
    if bad:
        parser.exit(2, f"paper_scale: error: --parts {','.join(bad)} not allowed: choose from "
                       f"{', '.join(p.name for p in PARTS)}\n")
    if not args.budget > CLOSING_S + 10:
        parser.exit(2, f"paper_scale: error: --budget {args.budget} not allowed: more than {CLOSING_S + 10:.0f} seconds\n")
    if args.grid_steps < 1:
        parser.exit(2, f"paper_scale: error: --grid-steps {args.grid_steps} not allowed: at least 1\n")
    args.parts = chosen
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.out / "work"  # run folders: archived into runs.tar.gz, then left behind
    outputs = args.work / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, STABEXP_OUTPUTS=str(outputs), PYTHONUNBUFFERED="1")
    if args.data:
        env["STABEXP_DATA"] = str(args.data.resolve())
    log_path = args.out / "log.txt"
    parts = [p for p in PARTS if p.name in args.parts]
    rows, sections = [], []
    with open(log_path, "a") as log:
        for i, part in enumerate(parts):
            left = args.budget - CLOSING_S - (time.monotonic() - started)
            allotted = left * part.share / sum(p.share for p in parts[i:])
            if allotted < 5:
                rows.append((part, "not started: the budget was spent", 0.0, []))
                continue
            t0, offset = time.monotonic(), log_path.stat().st_size
            outcome = "done"
            for command in part.commands(args):
                remaining = allotted - (time.monotonic() - t0)
                if remaining < 1:
                    outcome = f"cut after {allotted:.0f} s"
                    break
                outcome = run_within(command, remaining, log, env)
                if outcome != "done":
                    break
            log.flush()
            rows.append((part, outcome, time.monotonic() - t0, packing_lines(log_path, offset)))
            if part.name == "gpu_check":
                with open(log_path, errors="replace") as f:
                    f.seek(offset)
                    sections.append(("gpu_check", gpu_check_table(f.read())))
        record = stabexp_command("claims", str(outputs), "--record", str(args.out / "evidence.csv"))
        recorded = run_within(record, max(CLOSING_S - 5, 5), log, env)
        ids = claims_of(parts)
        table = subprocess.run(stabexp_command("claims", str(outputs), "--only", ",".join(ids)),
                               capture_output=True, text=True, env=env) if ids else None
    if "throughput" in args.parts:
        sections.insert(0, ("throughput", bench_table(args.out)))
    n_files = archive(outputs, args.out / "runs.tar.gz")
    counts = finished_runs(outputs)
    import torch

    device = torch.cuda.get_device_name() if args.device == "cuda" and torch.cuda.is_available() else "cpu"
    lines = [f"# paper_scale: {device}, torch {torch.__version__}, budget {args.budget:.0f} s, "
             f"{time.monotonic() - started:.0f} s in all{', quick' if args.quick else ''}", "",
             "| part | what | outcome | seconds | runs completed / diverged / unfinished | packing |",
             "|---|---|---|---|---|---|"]
    for part, outcome, seconds, packed in rows:
        c = counts.get(part.preset or "", {})
        runs = f"{c.get('completed', 0)} / {c.get('diverged', 0)} / {c.get('unfinished', 0)}" if part.preset else "-"
        lines.append(f"| {part.name} | {part.what} | {outcome} | {seconds:.0f} | {runs} | "
                     f"{'; '.join(p.split(': ', 1)[-1] for p in packed) or '-'} |")
    if "admin_grid" in args.parts and not args.quick:
        lines.append(f"\nAdmin's grid ran {args.grid_steps} updates per run, not the paper's 8000.")
    for name, text in sections:
        lines += ["", f"## {name}", "", text]
    lines += ["", "## claims", "", f"record: {recorded}; {n_files} files in runs.tar.gz; the claims these runs feed, "
              "judged on them alone (with docs/data: `stabexp claims docs/data OUT/evidence.csv`)", ""]
    lines.append((table.stdout.strip() or table.stderr.strip()[-2000:]) if table else "no claim reads these parts")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [part.name for part, outcome, _, _ in rows if outcome.startswith("failed")]
    return 1 if failed or recorded != "done" else 0


if __name__ == "__main__":
    sys.exit(main())
