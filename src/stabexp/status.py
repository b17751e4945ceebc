"""`stabexp status [SWEEP_DIR]`: every run of a sweep with where it stands, what a cluster user
checks in the morning.

A run is completed or diverged (finished), running (a live process holds its lock), interrupted
(stopped on request, or killed: its summary still says running but no process holds it),
failed (an error; see its error.txt), or not started. The jobs a sweep will run come from its
multirun.yaml (the command line's overrides and the preset's hydra.sweeper.params, expanded as
Hydra's basic sweeper does), so runs that have not started yet are listed too.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from stabexp.config import run_name
from stabexp.train.checkpoint import CHECKPOINT
from stabexp.train.files import SUMMARY, current_status, read_summary, summary_file_problem

# "unreadable": a summary.json that is not a run's (train.files.summary_problem), which a run into
# its folder refuses until overwrite=true; the same command does not resume it.
STATES = ("completed", "diverged", "running", "interrupted", "failed", "not started", "unreadable")


def run_state(run: Path) -> Dict:
    """status, last step written, the step a rerun resumes from, and the error if any."""
    summary = read_summary(run) or {}
    unreadable = summary_file_problem(run / SUMMARY) if not summary and os.path.lexists(run / SUMMARY) else None
    status = "unreadable" if unreadable else current_status(run, summary.get("status"))
    checkpoint_step = summary.get("checkpoint_step") if (run / CHECKPOINT).exists() else None
    if status in ("completed", "diverged", "not started", "unreadable"):
        resumes = "-"
    elif status == "running":
        resumes = f"step {checkpoint_step}" if checkpoint_step else "start"
    else:
        resumes = f"step {checkpoint_step}" if checkpoint_step else "start (no checkpoint)"
    return {"run": run.name, "status": status, "last_step": _last_step(run / "metrics.csv"),
            "steps": summary.get("steps"), "resumes_at": resumes, "threads": summary.get("threads"),
            "note": f"summary.json is not a run's: {unreadable}" if unreadable else
                    (summary.get("error") or "") if status == "failed" else
                    (f"at step {summary.get('diverged_at_step')}" if status == "diverged" else
                     (f"by {summary['interrupted_by']}" if summary.get("interrupted_by") else ""))}


def _last_step(metrics: Path) -> Optional[int]:
    """The step of the last row of metrics.csv, read from the file's end; None where there is no
    such file to read: none, a folder, a FIFO or a device in its place (reading a FIFO waits for
    ever, /dev/zero never ends), or one this user may not read."""
    if not metrics.is_file():
        return None
    try:
        with open(metrics, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return None
    last = lines[-1].split(",")[0] if lines else ""
    return int(last) if last.isdigit() else None


def expected_jobs(sweep: Path) -> List[str]:
    """The folder names of the jobs the sweep of `sweep`/multirun.yaml runs ([] if unknown)."""
    path = sweep / "multirun.yaml"
    if not path.exists():
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if multirun_problem(path) is not None:
        return []
    hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra", {})
    task = list(hydra.get("overrides", {}).get("task") or [])
    try:
        parsed = OverridesParser.create().parse_overrides(task)
        on_cli = {o.get_key_element() for o in parsed}
        params = hydra.get("sweeper", {}).get("params") or {}
        parsed += OverridesParser.create().parse_overrides(
            [f"{k}={v}" for k, v in params.items() if k not in on_cli])
        parsed = list({o.get_key_element(): o for o in parsed}.values())  # the last of a repeated key wins
        values = [[f"{o.get_key_element()}={v}" for v in
                   (o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()])]
                  for o in parsed]
    except Exception:  # glob() needs the config loader, intervals a sampling sweeper: list what exists
        return []
    return [run_name(list(combo)) for combo in itertools.product(*values)]


def multirun_problem(path: Path) -> Optional[str]:
    """Why a multirun.yaml is not a sweep's record Hydra wrote (its hydra.overrides.task a list
    of override strings, its sweeper's params a mapping); None when it is one."""
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as err:
        return f"it cannot be read as YAML ({str(err).splitlines()[0][:60]})"
    hydra = data.get("hydra") if isinstance(data, dict) else None
    if not isinstance(hydra, dict):
        return "it holds no hydra: mapping"
    overrides = hydra.get("overrides") or {}
    task = overrides.get("task") if isinstance(overrides, dict) else None
    params = (hydra.get("sweeper") or {}).get("params") if isinstance(hydra.get("sweeper") or {}, dict) else None
    if not isinstance(overrides, dict) or not (task is None or isinstance(task, list) and
                                               all(isinstance(t, str) for t in task)):
        return "its hydra.overrides.task is not a list of overrides"
    if params is not None and not isinstance(params, dict):
        return "its hydra.sweeper.params is not a mapping"
    return None


def sweep_states(sweep: Path) -> List[Dict]:
    names = expected_jobs(sweep)
    found = sorted(p.name for p in sweep.iterdir()
                   if p.is_dir() and ((p / "summary.json").exists() or (p / ".hydra").exists()))
    names += [n for n in found if n not in names]
    return [run_state(sweep / n) for n in names]


def format_states(sweep: Path, states: List[Dict]) -> str:
    # The threads: a CPU run's numbers depend on them (docs/scale.md, "The same files").
    lines = [str(sweep), "", "| run | status | last step | resumes at | threads | note |", "|---|---|---|---|---|---|"]
    for s in states:
        last = "-" if s["last_step"] is None else f"{s['last_step']}" + (f"/{s['steps']}" if s["steps"] else "")
        threads = "-" if s["threads"] is None else s["threads"]
        lines.append(f"| {s['run']} | {s['status']} | {last} | {s['resumes_at']} | {threads} | {s['note'][:80]} |")
    counts = {state: sum(s["status"] == state for s in states) for state in STATES}
    lines += ["", f"{len(states)} runs: " + ", ".join(f"{n} {state}" for state, n in counts.items() if n)]
    unfinished = counts["interrupted"] + counts["failed"] + counts["not started"]
    if counts["running"]:
        # A process still works on the sweep: it starts the runs not yet started itself.
        lines.append("The sweep is still running" + (": once its process has ended, the same command resumes "
                                                     "what did not finish." if unfinished else "."))
    elif unfinished:
        lines.append("Run the same command again: it skips the finished runs and resumes the others "
                     "from their checkpoints.")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    from stabexp.report import sweep_folder

    folder = sweep_folder(argv, "status", "; a run folder works too", made_by="stabexp run")
    if isinstance(folder, int):
        return folder
    if (folder / "summary.json").exists() or (folder / "config.yaml").exists():
        print(format_states(folder.parent, [run_state(folder)]))
        return 0
    problem = multirun_problem(folder / "multirun.yaml") if (folder / "multirun.yaml").exists() else None
    if problem is not None:  # the jobs it would name are unknown: those whose folders exist are listed
        print(f"stabexp: note: {folder / 'multirun.yaml'} is not a sweep's record ({problem}): the run folders "
              "there are listed, and jobs not yet started are not", file=sys.stderr)
    states = sweep_states(folder)
    if not states:  # as `stabexp report` says of such a folder
        print(f"stabexp: error: no run folders (summary.json) or sweep (multirun.yaml) under {folder}",
              file=sys.stderr)
        return 2
    print(format_states(folder, states))
    return 0
