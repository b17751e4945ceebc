"""Read run folders into tidy tables: one row per run, per run and step, per run, step and
sublayer. `make plots`, `stabexp report` and the Python API (stabexp.api) all read runs here.

A run folder is any folder holding summary.json; its id (`run`) is its path relative to the
folder collected (to its parent when that folder is itself a run).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import yaml

from stabexp.probes.builtin import PROBES
from stabexp.train.files import find_runs, read_run_table, read_summary, summary_file_problem

log = logging.getLogger("stabexp")

# Identify a run in every table; `sweep` is the folder that holds the run folder.
RUN_COLUMNS = ["run", "sweep", "experiment", "scale", "group", "depth", "decoder_depth", "seed",
               "model", "status"]
# The per-run files read into a table of the same name (without .csv): every run's two, and each
# built-in probe's own files (probes/builtin.py), which exist only when its probe is on.
RUN_FILES = ("metrics", "layers", *(name.removesuffix(".csv") for probe in PROBES.values() for name in probe.files))
# Reference losses a task records in summary.json's "data": the unigram model's (task=lm), and
# the symbol tasks' rules that stop short of the task (data/symbols.py rule_losses).
DATA_REFERENCES = ("unigram_eval_loss", "source_counts_eval_loss", "source_counts_eval_acc",
                   "position_only_eval_loss", "position_only_eval_acc")


class Tables(dict):
    """{"runs", *RUN_FILES} -> DataFrame, also read as attributes (`tables.runs`)."""

    def __getattr__(self, name: str) -> pd.DataFrame:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def collect(outputs: Path) -> Tables:
    """{"runs": one row per run, "metrics": per run and step, "layers": per run, step, sublayer,
    "dependency": per run, step, sublayer and component (probe.dependency), "update_bound": per
    run, step and sublayer (probe.update_bound), "layer_importance": per run, step and layer
    (probe.layer_importance), "attention_mixing": per run, step and attention sublayer
    (probe.attention_mixing)} of every run folder under `outputs` (or of
    `outputs` itself when it is a run folder)."""
    outputs = Path(outputs)
    root = outputs.parent if (outputs / "summary.json").is_file() else outputs
    runs, files = [], {name: [] for name in RUN_FILES}
    for folder in find_runs(outputs):
        summary = read_summary(folder)
        if summary is None:
            log.warning("skipped %s: its summary.json is not a run's (%s)", folder,
                        summary_file_problem(folder / "summary.json"))
            continue
        run_id = str(folder.relative_to(root))
        overrides = _overrides(folder)
        info = {"run": run_id, "sweep": str(folder.parent.relative_to(root)),
                 **{k: summary.get(k) for k in RUN_COLUMNS[2:]}}
        info["scale"] = info["scale"] or "default"
        optim, predicted = summary.get("optim") or {}, summary.get("theory") or {}
        runs.append({**info, "d_model": summary.get("d_model"), "optim": optim.get("name"),
                     "lr": optim.get("lr"), "weight_decay": optim.get("weight_decay"),
                     "momentum": optim.get("momentum"), "beta1": optim.get("beta1"),
                     "theory_angular_update": predicted.get("angular_update"),
                     "theory_time_constant": predicted.get("time_constant"),
                     "steps_done": summary.get("steps_done"),
                     "diverged_at_step": summary.get("diverged_at_step"),
                     "final_eval_loss": summary.get("final_eval_loss"),
                     "final_eval_acc": summary.get("final_eval_acc"),
                     "chance_loss": summary.get("chance_loss"), "task": summary.get("task"),
                     "final_eval_ppl": summary.get("final_eval_ppl"), "valid_bleu": summary.get("valid_bleu"),
                     "test_bleu": summary.get("test_bleu"), "bleu_signature": summary.get("bleu_signature"),
                     "arch": summary.get("arch"), "test_loss": summary.get("test_loss"), "overrides": overrides,
                     "wall_seconds": summary.get("wall_seconds"), "steps_per_second": summary.get("steps_per_second"),
                     "peak_memory_mib": summary.get("peak_memory_mib"),
                     "features_init_norm": summary.get("features_init_norm"),
                     "grad_scaling_error": summary.get("grad_scaling_error"),
                     **{key: (summary.get("data") or {}).get(key) for key in DATA_REFERENCES}})
        for name, sink in files.items():
            path = folder / f"{name}.csv"
            if path.exists() and path.stat().st_size > 0:
                try:
                    frame = read_run_table(path)
                except (ValueError, pd.errors.ParserError) as err:  # not a CSV file (or not text)
                    log.warning("skipped %s: %s", path, str(err).splitlines()[0][:100])
                    continue
                for key, value in reversed(list(info.items())):
                    frame.insert(0, key, value)
                sink.append(frame)
    return Tables(runs=pd.DataFrame(runs),
                  **{name: pd.concat(sink, ignore_index=True) if sink else pd.DataFrame()
                     for name, sink in files.items()})


def _overrides(folder: Path):
    """The command-line overrides of a run, from Hydra's record (`.hydra/overrides.yaml`), as
    one "__"-joined string in sorted order; None for a run made without Hydra (tests)."""
    path = folder / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    try:
        overrides = yaml.safe_load(path.read_text())
    except (ValueError, yaml.YAMLError):  # not YAML (or not text)
        return None
    return "__".join(sorted(str(o) for o in overrides)) if isinstance(overrides, list) else None


def write_collected(outputs: Path) -> Path:
    """Write outputs/collected/{runs,metrics,layers,...}.csv (RUN_FILES); return that folder."""
    tables = collect(outputs)
    target = Path(outputs) / "collected"
    target.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame.to_csv(target / f"{name}.csv", index=False)
    return target
