"""`stabexp report [SWEEP_DIR]`: a markdown table of a sweep, one row per group, one column per
depth; a cell is the final eval loss and token accuracy (mean over seeds), or "diverged @ step k".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import pandas as pd

from stabexp.config import outputs_dir
from stabexp.plotting.collect import collect
from stabexp.plotting.figures import GROUP_ORDER


def _cell(runs: pd.DataFrame) -> str:
    diverged = runs[runs.status == "diverged"]
    parts = []
    done = runs[runs.status == "completed"]
    if not done.empty:
        n = f", n={len(done)}" if len(done) > 1 else ""
        parts.append(f"{done.final_eval_loss.mean():.3f} ({done.final_eval_acc.mean():.3f}{n})")
    parts += [f"diverged @ step {int(k)}" for k in diverged.diverged_at_step]
    other = runs[~runs.status.isin(["completed", "diverged"])]
    parts += [str(s) for s in other.status]
    return "; ".join(parts) or "-"


def sweep_table(sweep_dir: Path) -> str:
    runs = collect(sweep_dir)["runs"]
    if runs.empty:
        raise FileNotFoundError(f"no run folders (summary.json) under {sweep_dir}")
    depths = sorted(runs.depth.unique())
    groups = sorted(runs.group.unique(), key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER else 99, g))
    lines = ["| group | " + " | ".join(f"{d}L-{d}L" for d in depths) + " |",
             "|---|" + "---|" * len(depths)]
    for g in groups:
        cells = [_cell(runs[(runs.group == g) & (runs.depth == d)]) for d in depths]
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    chance = runs.chance_loss.dropna()
    note = f"Cells: final eval loss (token accuracy). Chance loss {chance.iloc[0]:.3f}." if len(chance) else ""
    return f"{sweep_dir}\n\n" + "\n".join(lines) + ("\n\n" + note if note else "")


def latest_sweep() -> Optional[Path]:
    sweeps = [p for p in (outputs_dir() / "multirun").glob("*") if p.is_dir()]
    return max(sweeps, key=lambda p: p.stat().st_mtime) if sweeps else None


def main(argv: List[str]) -> int:
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: stabexp report [SWEEP_DIR]   (default: the newest folder under "
              f"{outputs_dir() / 'multirun'})", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    sweep = Path(argv[0]) if argv else latest_sweep()
    if sweep is None or not sweep.is_dir():
        print(f"stabexp: error: no sweep folder {argv[0] if argv else 'under ' + str(outputs_dir() / 'multirun')}: "
              "pass a folder made by `stabexp run -m`", file=sys.stderr)
        return 2
    try:
        print(sweep_table(sweep))
    except FileNotFoundError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    return 0
