"""Python API for notebooks: runs and sweeps as pandas DataFrames.

These are the readers `stabexp report` and `make plots` use, so a notebook sees the same tables:

    from stabexp import api
    sweep = api.load_sweep("outputs/multirun/experiment=deepnet_early")
    sweep.runs                       # one row per run: group, depth, seed, status, final losses, ...
    sweep.metrics                    # one row per run and step (metrics.csv of every run)
    sweep.layers                     # one row per run, step and sublayer (layers.csv)
    sweep.dependency                 # probe.dependency: per run, step, sublayer, component
    sweep.update_bound               # probe.update_bound: DeepNet Theorem 4.1's terms per run, step, sublayer
    sweep.layer_importance           # probe.layer_importance: the loss of skipping each layer, per run, step
    run = api.load_run(sweep.runs.run[0], root=sweep.folder)
    run.summary["constants"], run.config["train"]["lr"], run.metrics.model_update
    print(api.report(sweep.folder))  # the markdown `stabexp report` prints

The columns are documented in docs/outputs.md; the fits (output change against depth, W_2
gradient slopes, the SMD equilibrium, LR sensitivity) are those of stabexp.analysis, re-exported
here. docs/api.md has a worked example.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import pandas as pd

from stabexp.analysis import (  # noqa: F401  (re-exported: the fits the report and figures use)
    clinic_fits,
    clinic_ratio,
    depth_law,
    encoder_input_change,
    final_max_logit,
    last_w2_grad,
    layer_importance_table,
    lr_sensitivity,
    lr_sensitivity_table,
    output_change_fits,
    output_change_table,
    preln_stream_growth,
    smd_equilibrium,
    stream_growth,
    update_bound_steps,
    update_bound_table,
    w2_grad_slopes,
)
from stabexp.paths import outputs_dir
from stabexp.plotting.collect import Tables, collect
from stabexp.plotting.figures import preset_tables, read_collected
from stabexp.train.files import read_json, read_run_table, summary_file_problem

PathLike = Union[str, Path]

__all__ = ["Run", "Sweep", "load_run", "load_sweep", "load_outputs", "load_collected", "preset",
           "report", "clinic_fits", "clinic_ratio", "depth_law", "encoder_input_change", "final_max_logit",
           "last_w2_grad", "layer_importance_table", "lr_sensitivity", "lr_sensitivity_table", "output_change_fits", "output_change_table",
           "preln_stream_growth", "smd_equilibrium", "stream_growth", "update_bound_steps", "update_bound_table", "w2_grad_slopes"]


@dataclass
class Run:
    """One run folder: what it wrote, read as Python objects."""

    folder: Path
    summary: dict                   # summary.json: status, final losses, constants, data, ...
    config: dict                    # config.yaml: the resolved config the run trained with
    metrics: pd.DataFrame           # metrics.csv as written: one row per recorded step
    layers: pd.DataFrame            # layers.csv as written: one row per step and sublayer (or weight)
    dependency: pd.DataFrame        # dependency.csv (probe.dependency); empty without it
    update_bound: pd.DataFrame      # update_bound.csv (probe.update_bound); empty without it
    layer_importance: pd.DataFrame  # layer_importance.csv (probe.layer_importance); empty without it

    @property
    def status(self) -> str:
        return self.summary.get("status", "unknown")

    def table(self, name: str) -> pd.DataFrame:
        """Any CSV file of the folder by its name (`grad_alignment` for grad_alignment.csv): the file of a
        plug-in probe (probe.extra); empty when the folder has none."""
        return _csv(self.folder / f"{name}.csv")

    @property
    def tables(self) -> Tables:
        """The run as a sweep of one (runs, metrics, layers with the run's columns), read when asked."""
        return collect(self.folder)


class Sweep(Tables):
    """The tables of every run under a folder (a sweep, or a whole outputs tree): `runs`,
    `metrics`, `layers`, `dependency`, `update_bound`, `layer_importance`, and the `folder` they were read from."""

    def __init__(self, tables: Tables, folder: Path):
        super().__init__(tables)
        self.folder = folder

    def run(self, name: str) -> Run:
        """The run whose `run` id (as in the tables) is `name`."""
        return load_run(name, root=self.folder)


def _folder(path: PathLike, root: Optional[PathLike] = None) -> Path:
    folder = Path(path).expanduser()
    if root is not None and not folder.is_absolute():
        folder = Path(root).expanduser() / folder
    return folder


def load_run(path: PathLike, root: Optional[PathLike] = None) -> Run:
    """One run folder (the folder holding summary.json); `root` resolves a relative id such as
    the `run` column of a sweep's tables."""
    folder = _folder(path, root)
    summary_file = folder / "summary.json"
    if not os.path.lexists(summary_file):
        raise FileNotFoundError(f"{folder} is not a run folder: it holds no summary.json")
    problem = summary_file_problem(summary_file)
    if problem:
        raise ValueError(f"{summary_file} is not a run's summary: {problem}")
    summary = read_json(summary_file)
    config = {}
    if (folder / "config.yaml").is_file():
        from stabexp.train.folder import recorded_config

        config = recorded_config(folder)
    return Run(folder=folder, summary=summary, config=config, metrics=_csv(folder / "metrics.csv"),
               layers=_csv(folder / "layers.csv"), dependency=_csv(folder / "dependency.csv"),
               update_bound=_csv(folder / "update_bound.csv"),
               layer_importance=_csv(folder / "layer_importance.csv"))


def _csv(path: Path) -> pd.DataFrame:
    return read_run_table(path)


def _sweep_folder(path: Optional[PathLike]) -> Path:
    """The folder a sweep lives in: `path`, or the newest under outputs/multirun (as `stabexp
    report` picks it)."""
    if path is None:
        from stabexp.report import latest_sweep

        path = latest_sweep()
        if path is None:
            raise FileNotFoundError(f"no sweep under {outputs_dir() / 'multirun'}")
    folder = _folder(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"no folder {folder}")
    return folder


def load_sweep(path: Optional[PathLike] = None) -> Sweep:
    """Every run under a sweep folder (default: the newest under outputs/multirun), as tables
    of runs, metrics and layers; `run` ids are relative to the folder."""
    folder = _sweep_folder(path)
    return Sweep(collect(folder), folder)


def load_outputs(path: Optional[PathLike] = None) -> Sweep:
    """Every run under the outputs folder (default: the one `stabexp run` writes to), read from
    the run folders, as `make plots` collects them."""
    return load_sweep(outputs_dir() if path is None else path)


def load_collected(path: Optional[PathLike] = None) -> Sweep:
    """The tables the last `make plots` wrote under OUTPUTS/collected (what the figures read)."""
    folder = outputs_dir() if path is None else _folder(path)
    return Sweep(read_collected(folder / "collected"), folder)


def preset(tables: Tables, experiment: str) -> Tables:
    """The rows of one preset's runs, chosen as its figures choose them: the default scale when
    there are runs at it, else the quick ones; the preset's own task."""
    return preset_tables(tables, experiment)


def report(path: Optional[PathLike] = None) -> str:
    """The markdown `stabexp report [SWEEP_DIR]` prints."""
    from stabexp.report import sweep_table

    return sweep_table(_sweep_folder(path))
