"""The finished cells of long sweeps, kept as a small tidy table in the repository.

A sweep of many CPU-hours can outlast the machine it started on, and outputs/ is not kept.
What the figures and the results page need of it is one row per finished run (its group, depth,
seed, setting, final numbers, cost and date), small enough to commit under docs/data/ and to
grow cell by cell as more runs finish, with the runs' validation curves beside it
(NAME_curves.csv).
`record` adds or replaces the rows of the runs under some sweep folders;
`scripts/record_cells.py` is its command line.

A row's key is (recipe, group, depth, decoder_depth, seed, setting): `recipe` names the shared
settings the runs were made with (a preset's name: runs of two presets with the same recipe,
e.g. lm_depth and deepnet_depth_law, are the same runs), `setting` the run's own overrides
besides group, depth, seed, experiment and scale (e.g. robustness=lr_x0.5).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Iterable

import pandas as pd

from stabexp.analysis import setting
from stabexp.plotting.collect import collect

KEY = ["recipe", "group", "depth", "decoder_depth", "seed", "setting"]
COLUMNS = KEY + ["experiment", "task", "status", "steps_done", "diverged_at_step", "final_eval_loss", "final_eval_acc",
                 "test_loss", "test_bleu", "valid_bleu", "wall_seconds", "s_per_step", "peak_memory_mib", "date"]
CURVE_COLUMNS = KEY + ["step", "eval_loss", "valid_bleu"]
FINISHED = ("completed", "diverged")


def _finished(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs[runs.status.isin(FINISHED)].copy()
    runs["setting"] = runs.overrides.map(setting) if "overrides" in runs else ""
    return runs


def _in_columns(frame: pd.DataFrame, columns) -> pd.DataFrame:
    for column in columns:
        if column not in frame:
            frame[column] = None
    return frame[columns].reset_index(drop=True)


def from_tables(tables, recipe: str, dates=None):
    """(cells in COLUMNS, their eval curves in CURVE_COLUMNS) of the finished runs of collected
    tables (plotting/collect.py); `dates` by run id."""
    runs = tables["runs"]
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS), pd.DataFrame(columns=CURVE_COLUMNS)
    runs = _finished(runs).assign(recipe=recipe)
    runs["s_per_step"] = 1 / runs.steps_per_second if "steps_per_second" in runs else None
    runs["date"] = runs.run.map(dates) if dates is not None else ""
    metrics = tables["metrics"]
    if metrics.empty or "eval_loss" not in metrics:
        curves = pd.DataFrame(columns=CURVE_COLUMNS)
    else:
        curves = metrics.dropna(subset=["eval_loss"]).merge(runs[["run", "setting", "recipe"]], on="run")
    return _in_columns(runs, COLUMNS), _in_columns(curves, CURVE_COLUMNS)


def finished_cells(sweep_dir: Path, recipe: str):
    """(cells, curves) of the finished runs (completed or diverged) under sweep_dir."""
    tables = collect(sweep_dir)
    root = Path(sweep_dir)
    dates = {run: datetime.date.fromtimestamp((_run_folder(root, run) / "summary.json").stat().st_mtime).isoformat()
             for run in tables["runs"].get("run", [])}
    return from_tables(tables, recipe, dates)


def _run_folder(root: Path, run: str) -> Path:
    folder = root.parent / run
    return folder if (folder / "summary.json").is_file() else root / run


def _no_nan(setting: pd.Series) -> pd.Series:
    # An empty setting reads back from CSV as NaN (a float column when every one is empty).
    return setting.astype(object).where(setting.notna(), "").astype(str)


def curves_path(table: Path) -> Path:
    """The eval curves kept beside a cells table: NAME_curves.csv."""
    return Path(table).with_name(Path(table).stem + "_curves.csv")


def _merge(path: Path, new, columns, key) -> pd.DataFrame:
    old = read(path) if Path(path).is_file() else pd.DataFrame(columns=columns)
    frames = [f for f in [old, *new] if not f.empty]
    merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    merged["setting"] = _no_nan(merged.setting)
    for column in ("depth", "decoder_depth", "seed", "steps_done", "diverged_at_step", "step"):
        if column in merged:
            merged[column] = pd.to_numeric(merged[column], errors="coerce").astype("Int64")
    merged = merged.drop_duplicates(key, keep="last").sort_values([k for k in key if k != "decoder_depth"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    merged[columns].to_csv(path, index=False)
    return merged.reset_index(drop=True)


def record(table: Path, sweep_dirs: Iterable[Path], recipe: str) -> pd.DataFrame:
    """Add the finished runs under sweep_dirs to the table at `table` (a row per KEY: a cell
    measured again replaces its row) and their eval curves to curves_path(table); write both
    back sorted, return the table."""
    found = [finished_cells(Path(d), recipe) for d in sweep_dirs]
    _merge(curves_path(table), [c for _, c in found], CURVE_COLUMNS, KEY + ["step"])
    return _merge(table, [cells for cells, _ in found], COLUMNS, KEY)


def read(table: Path) -> pd.DataFrame:
    """The cells table, `setting` "" where a run had no setting of its own."""
    frame = pd.read_csv(table, keep_default_na=False, na_values=[""])
    frame["setting"] = _no_nan(frame.setting)
    return frame


def describe(frame: pd.DataFrame) -> str:
    """One line per recipe: cells and dates, for the record script's output."""
    return "\n".join(f"{recipe}: {len(rows)} cells, {', '.join(sorted(set(rows.date.astype(str))))}"
                     for recipe, rows in frame.groupby("recipe"))
