"""Every JSON file stabexp writes parses under a strict reader (no NaN, no Infinity), and
`stabexp report` on sweeps as they are found: diverged, unfinished, without their CSVs, and
two sweeps that share a run."""

import json
import math
import shutil

import numpy as np
import pytest
import torch

from stabexp.report import sweep_table
from stabexp.train.files import json_text, read_json, read_summary, write_json
from stabexp.train.trainer import train


def strict(text: str):
    """json.loads as a strict reader (JavaScript's JSON.parse, jq) reads: NaN and Infinity refused."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_a_diverged_runs_summary_is_strict_json_with_its_nan_recorded(make_cfg, tmp_path):
    summary = train(make_cfg("group=postln", "train.lr=1e12"), tmp_path / "run")
    assert summary["status"] == "diverged" and math.isnan(summary["last_loss"])
    written = strict((tmp_path / "run" / "summary.json").read_text())
    assert written["last_loss"] is None and written["non_finite"] == {"last_loss": "nan"}
    again = read_summary(tmp_path / "run")  # what stabexp reads back: the NaN, and no record
    assert math.isnan(again["last_loss"]) and "non_finite" not in again
    assert again["first_loss"] == summary["first_loss"] and again["status"] == "diverged"


def test_json_text_writes_every_non_finite_number_as_null_and_read_json_puts_it_back(tmp_path):
    data = {"loss": float("-inf"), "theory": {"time_constant": np.float32("inf"), "rate": 0.5},
            "alpha": [1.0, float("nan")], "norm": torch.tensor(float("nan")), "steps": 3, "ok": True,
            "pair": (1, np.float64(2.5))}
    written = strict(json_text(data))
    assert written == {"loss": None, "theory": {"time_constant": None, "rate": 0.5}, "alpha": [1.0, None],
                       "norm": None, "steps": 3, "ok": True, "pair": [1, 2.5],
                       "non_finite": {"loss": "-inf", "theory.time_constant": "inf", "alpha.1": "nan", "norm": "nan"}}
    write_json(tmp_path / "a.json", data)
    back = read_json(tmp_path / "a.json")
    assert back["loss"] == -math.inf and back["theory"] == {"time_constant": math.inf, "rate": 0.5}
    assert math.isnan(back["alpha"][1]) and math.isnan(back["norm"]) and "non_finite" not in back
    assert strict(json_text({"finite": 1.5})) == {"finite": 1.5}  # nothing to record: no record
    # Each object of a list records its own; a file of an older stabexp (NaN written as such) reads as it did.
    assert strict(json_text([{"a": float("nan")}, {"b": 1}])) == [{"a": None, "non_finite": {"a": "nan"}}, {"b": 1}]
    (tmp_path / "old.json").write_text('{"last_loss": NaN}')
    assert math.isnan(read_json(tmp_path / "old.json")["last_loss"])
    (tmp_path / "summary.json").write_bytes(b"\xff\xfe\x00binary")  # not a summary, not even text
    assert read_summary(tmp_path) is None


BOUND = ("probe.update_bound=true", "group=postln")


def test_report_of_an_update_bound_sweep_without_a_measured_update_says_what_it_left_out(make_cfg, tmp_path):
    sweep = tmp_path / "sweep"
    train(make_cfg(*BOUND, "train.lr=1e12"), sweep / "diverged")  # NaN weights after step 1
    table = sweep_table(sweep)
    assert "Left out of the bound (no finite model update measured after step 0): diverged (diverged @ step 2)" in table
    assert "| bound_1 |" not in table  # no table of nothing
    train(make_cfg(*BOUND, "seed=1"), sweep / "killed")
    summary = read_summary(sweep / "killed")  # as a run killed before its first checkpoint leaves it
    del summary["features_init_norm"]
    write_json(sweep / "killed" / "summary.json", dict(summary, status="running"))
    train(make_cfg(*BOUND, "seed=2"), sweep / "bare")
    (sweep / "bare" / "metrics.csv").unlink()
    table = sweep_table(sweep)
    left_out = next(line for line in table.splitlines() if line.startswith("Left out"))
    assert "diverged (diverged @ step 2)" in left_out
    assert "killed (interrupted, no ||F(x, theta_0)|| in its summary yet)" in left_out
    assert "bare (completed)" in left_out and "Without metrics.csv (only summary.json read): bare" in table
    cell = next(line for line in table.splitlines() if line.startswith("| postln |"))
    assert "interrupted" in cell and "running" not in cell  # no process holds it: not running
    # A run that measured its update is in the table, the others still said.
    train(make_cfg(*BOUND, "seed=3"), sweep / "fine")
    table = sweep_table(sweep)
    row = next(line for line in table.splitlines() if line.startswith("| postln | 2 | 1 |"))
    assert "nan" not in row.split("|")[5]  # measured_1
    assert "fine (" not in next(line for line in table.splitlines() if line.startswith("Left out"))


def _lr_run(make_cfg, folder, lr):
    """A run whose folder is named as Hydra names a job of an lr sweep (no .hydra record: the name is its overrides)."""
    train(make_cfg(f"train.lr={lr}", "train.steps=3"), folder / f"train.lr={lr}")


def test_report_of_two_lr_sweeps_sharing_a_run_counts_it_once_and_says_so(make_cfg, tmp_path):
    _lr_run(make_cfg, tmp_path / "a", 0.001)
    _lr_run(make_cfg, tmp_path / "a", 0.01)
    shutil.copytree(tmp_path / "a" / "train.lr=0.01", tmp_path / "b" / "train.lr=0.01")
    _lr_run(make_cfg, tmp_path / "b", 0.1)
    table = sweep_table(tmp_path)
    lines = table.splitlines()
    assert "- b/train.lr=0.01 (same config as a/train.lr=0.01)" in lines
    head = lines.index("| setting | lr 0.001 | lr 0.01 | lr 0.1 | LR sensitivity |")
    assert lines[head + 2].startswith("| (defaults) |") and lines[head + 3] == ""  # one row, one cell per lr


def test_lr_settings_that_two_presets_share_are_told_apart():
    import pandas as pd

    from stabexp.analysis import lr_sensitivity_table

    runs = pd.DataFrame({"run": ["p/x", "p/y", "q/x", "q/y"], "experiment": ["p", "p", "q", "q"], "scale": "quick",
                         "sweep": ["p", "p", "q", "q"], "overrides": ["train.lr=0.01", "train.lr=0.1"] * 2,
                         "lr": [0.01, 0.1] * 2, "status": "completed", "final_eval_loss": [2.0, 1.0, 3.0, 4.0]})
    metrics = pd.DataFrame({"run": runs.run, "step": 0, "eval_loss": 5.0})
    table = lr_sensitivity_table(runs, metrics).set_index(["setting", "lr"])
    assert table.index.is_unique
    assert table.loc[("experiment=p scale=quick (defaults)", 0.1), "final_eval_loss"] == 1.0
    assert table.loc[("experiment=q scale=quick (defaults)", 0.01), "lr_sensitivity"] == pytest.approx(0.5)
    one = lr_sensitivity_table(runs[runs.experiment == "p"], metrics)
    assert set(one.setting) == {"(defaults)"}  # one preset: nothing to tell apart


def test_a_run_in_two_sweep_folders_is_one_run_of_its_cell(make_cfg, tmp_path):
    train(make_cfg("group=admin", "depth=1", "train.steps=3"), tmp_path / "a" / "admin1")
    shutil.copytree(tmp_path / "a" / "admin1", tmp_path / "b" / "admin1")
    lines = sweep_table(tmp_path).splitlines()
    assert "- b/admin1 (same config as a/admin1)" in lines
    admin = next(line for line in lines if line.startswith("| admin |"))
    assert "n=2" not in admin and "(" in admin


def test_a_run_of_one_config_at_other_threads_is_counted_once_and_the_threads_said(make_cfg, tmp_path):
    """The same config at 1 and 2 torch threads: other numbers (docs/scale.md). The report counts
    the cell once and says which threads each ran at, and whose numbers it shows."""
    train(make_cfg("group=admin", "depth=1", "train.steps=3", "train.threads=1"), tmp_path / "a" / "admin1")
    shutil.copytree(tmp_path / "a" / "admin1", tmp_path / "b" / "admin1")
    summary = tmp_path / "b" / "admin1" / "summary.json"
    summary.write_text(summary.read_text().replace('"threads": 1', '"threads": 2'))
    lines = sweep_table(tmp_path).splitlines()
    assert ("- b/admin1 (same config as a/admin1; it ran at 2 thread(s), a/admin1 at 1: the same config at "
            "other threads gives other numbers, and the table shows a/admin1's)") in lines


def test_grid_counts_compare_with_pre_ln_of_the_same_preset():
    import pandas as pd

    from stabexp.analysis import grid_counts

    runs = pd.DataFrame({"run": ["p/pre", "p/admin", "q/pre"], "experiment": ["p", "p", "q"], "scale": "default",
                         "group": ["preln", "admin", "preln"], "lr": 0.01, "status": "completed",
                         "overrides": ["group=preln", "group=admin", "group=preln"], "final_eval_loss": [3.0, 2.5, 2.0]})
    admin = grid_counts(runs).set_index("group").loc["admin"]
    assert admin.below_preln == "1 of 1"  # below p's Pre-LN (3.0), not q's (2.0)
