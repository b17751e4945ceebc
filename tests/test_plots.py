"""`make plots` on a small outputs tree made by real (tiny) runs."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from stabexp.plotting.collect import write_collected
from stabexp.plotting.figures import run_labels
from stabexp.train.trainer import train


def test_collector_reads_runs_that_no_preset_made(make_cfg, tmp_path):
    outputs = tmp_path / "outputs"
    for group in ("postln", "deepnorm"):
        train(make_cfg(f"group={group}"), outputs / "multirun" / "sweep" / f"group={group}")
    train(make_cfg("group=postln", "train.lr=1000", "train.steps=50"), outputs / "runs" / "diverging")
    collected = write_collected(outputs)
    runs = pd.read_csv(collected / "runs.csv")
    metrics = pd.read_csv(collected / "metrics.csv")
    assert len(runs) == 3 and set(runs.status) == {"completed", "diverged"}
    assert set(runs.sweep) == {"multirun/sweep", "runs"} and runs.experiment.isna().all()
    assert not metrics.duplicated(["run", "step"]).any()
    assert set(metrics.run) == set(runs.run)
    # Figures belong to presets: these runs are collected, and each figure names its preset.
    env = dict(os.environ, STABEXP_OUTPUTS=str(outputs))
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_plots.py"
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # One closing line for the figures not drawn, naming every preset without runs, once.
    assert "skipped" not in result.stdout
    closing = result.stdout.strip().splitlines()[-1]
    assert closing.startswith("drew 0 figures into ") and "presets have no runs yet: " in closing
    assert closing.count("deepnet_early,") == 1 and "lr_sensitivity" in closing


def test_an_unknown_figure_or_a_cells_table_for_another_is_one_line(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_plots.py"
    env = dict(os.environ, STABEXP_OUTPUTS=str(tmp_path))
    for args, says in ((["nosuch"], "no figure nosuch: choose one of model_update, "),
                       (["smd", "--cells", "docs/data/deepnet_cells.csv"], "--cells draws the figures drawn from cells")):
        result = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                                cwd=script.parents[1])
        assert result.returncode == 2 and says in result.stderr.splitlines()[-1], result.stderr
    assert not any(tmp_path.iterdir())  # nothing collected, nothing drawn


def test_a_figure_drawn_from_the_committed_cells(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_plots.py"
    env = dict(os.environ, STABEXP_OUTPUTS=str(tmp_path))
    result = subprocess.run([sys.executable, str(script), "deepnet_bleu_depth", "--cells", "docs/data/deepnet_cells.csv"],
                            env=env, capture_output=True, text=True, cwd=script.parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {tmp_path / 'figures' / 'deepnet_bleu_depth'}.png and .pdf (")
    assert "cells of multi30k_table in docs/data/deepnet_cells.csv" in result.stdout


def test_labels_tell_runs_apart():
    runs = pd.DataFrame({"run": ["s1/group=postln__train.lr=0.1", "s1/group=postln__train.lr=0.2",
                                 "s2/group=postln__train.lr=0.2", "s1/group=admin"],
                         "group": ["postln", "postln", "postln", "admin"]})
    labels = run_labels(runs)
    assert labels["s1/group=admin"] == "admin"
    assert labels["s1/group=postln__train.lr=0.1"] == "postln (train.lr=0.1)"
    assert len(set(labels.values())) == 4


def test_plots_with_no_runs_say_so(tmp_path):
    env = dict(os.environ, STABEXP_OUTPUTS=str(tmp_path / "empty"))
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_plots.py"
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    presets = sorted(f.stem for f in (Path(__file__).resolve().parents[1] / "conf" / "experiment").glob("*.yaml"))
    assert result.stdout.strip().splitlines()[-1] == (
        f"drew 0 figures into {tmp_path / 'empty' / 'figures'}; {len(presets)} presets have no runs yet: "
        f"{', '.join(presets)} (`stabexp run experiment=NAME`, or `make reproduce` for all)")


def test_compare_runs_finds_a_changed_cell_and_nothing_else(make_cfg, tmp_path):
    import runpy
    import shutil

    compare = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"))["main"]
    for tree in ("before", "after"):
        train(make_cfg("group=admin", "probe.every=1"), tmp_path / tree / "admin")
    assert compare([str(tmp_path / "before"), str(tmp_path / "after")]) == 0  # wall clock aside
    shutil.copytree(tmp_path / "after", tmp_path / "changed")
    layers = tmp_path / "changed" / "admin" / "layers.csv"
    lines = layers.read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.split(",")[5][-1:].isdigit())  # a grad_norm cell
    cells = lines[row].split(",")
    cells[5] = cells[5][:-1] + ("0" if cells[5][-1] != "0" else "1")  # its last digit
    lines[row] = ",".join(cells)
    layers.write_text("".join(lines))
    assert compare([str(tmp_path / "before"), str(tmp_path / "changed")]) == 1
