"""The finished cells of long sweeps, kept as a small tidy table in the repository.

A sweep of many CPU-hours outlives no machine: outputs/ is not kept. What the figures and the
results page need of it is one row per finished run (its group, depth, seed, setting, final
numbers, cost and date), small enough to commit under docs/data/ and to grow cell by cell as
sittings finish more runs, with the runs' validation curves beside it (NAME_curves.csv).
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

from stabexp.plotting.collect import collect

KEY = ["recipe", "group", "depth", "decoder_depth", "seed", "setting"]
COLUMNS = KEY + ["experiment", "task", "status", "steps_done", "diverged_at_step", "final_eval_loss", "final_eval_acc",
                 "test_loss", "test_bleu", "valid_bleu", "wall_seconds", "s_per_step", "peak_memory_mib", "date"]
CURVE_COLUMNS = KEY + ["step", "eval_loss", "valid_bleu"]
FINISHED = ("completed", "diverged")
_NOT_SETTING = ("group=", "depth=", "seed=", "experiment=", "scale=")


def setting(overrides) -> str:
    """A run's overrides besides those of the key and the preset ("" when none)."""
    if not isinstance(overrides, str):
        return ""
    return " ".join(p for p in overrides.split("__") if p and not p.startswith(_NOT_SETTING))


def from_runs(runs: pd.DataFrame, recipe: str, dates=None) -> pd.DataFrame:
    """Cells (COLUMNS) of a collected runs table's finished runs; `dates` by run id."""
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    runs = runs[runs.status.isin(FINISHED)].copy()
    runs["recipe"] = recipe
    runs["setting"] = runs.overrides.map(setting) if "overrides" in runs else ""
    runs["s_per_step"] = 1 / runs.steps_per_second if "steps_per_second" in runs else None
    runs["date"] = runs.run.map(dates) if dates is not None else ""
    for column in COLUMNS:
        if column not in runs:
            runs[column] = None
    return runs[COLUMNS].reset_index(drop=True)


def curves_from(metrics: pd.DataFrame, cells_runs: pd.DataFrame, recipe: str) -> pd.DataFrame:
    """The eval rows (CURVE_COLUMNS) of those runs: validation loss (and BLEU) over the steps."""
    if metrics.empty or "eval_loss" not in metrics:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    rows = metrics.dropna(subset=["eval_loss"]).merge(cells_runs[["run", "setting"]], on="run")
    rows = rows.assign(recipe=recipe)
    for column in CURVE_COLUMNS:
        if column not in rows:
            rows[column] = None
    return rows[CURVE_COLUMNS].reset_index(drop=True)


def finished_cells(sweep_dir: Path, recipe: str):
    """(cells, curves) of the finished runs (completed or diverged) under sweep_dir."""
    tables = collect(sweep_dir)
    runs = tables["runs"]
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS), pd.DataFrame(columns=CURVE_COLUMNS)
    root = Path(sweep_dir)
    dates = {run: datetime.date.fromtimestamp((_run_folder(root, run) / "summary.json").stat().st_mtime).isoformat()
             for run in runs.run}
    finished = runs[runs.status.isin(FINISHED)].assign(
        setting=lambda r: r.overrides.map(setting) if "overrides" in r else "")
    return from_runs(runs, recipe, dates), curves_from(tables["metrics"], finished, recipe)


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
