"""DeepNet's depth arguments: activation checkpointing, the Theorem 4.1 / 4.3 bound probe, the depth
law, peak memory per run, the committed cells table and the bench's checkpointing variant."""

import json
import math

import numpy as np
import pandas as pd
import pytest

import stabexp.train.trainer as trainer
from conftest import assert_same_files
from stabexp import cells
from stabexp.analysis import depth_law, update_bound_steps, update_bound_table
from stabexp.bench import parse_args
from stabexp.config import ConfigError
from stabexp.model.init import deepnorm_single_stack
from stabexp.plotting.collect import collect
from stabexp.train.trainer import train

LM = ["task=lm", "train.steps=8", "probe.first_steps=3", "probe.every=2", "train.eval_every=4"]


def test_activation_checkpointing_changes_no_number(make_cfg, tmp_path):
    # Dropout on: the recomputed forward must draw the masks of the first one.
    common = ["group=deepnorm", "model.dropout=0.1", "probe.every=1"]
    train(make_cfg(*common), tmp_path / "plain")
    train(make_cfg(*common, "train.activation_checkpointing=true"), tmp_path / "checkpointed")
    assert_same_files(tmp_path / "plain", tmp_path / "checkpointed", config=False)


def test_a_run_records_its_peak_memory(make_cfg, tmp_path):
    summary = train(make_cfg("group=postln"), tmp_path)
    assert summary["peak_memory_mib"] > 0


@pytest.mark.parametrize("group", ["deepnorm", "postln_init", "postln"])
def test_the_bound_probe_starts_at_zero_with_the_init_scales(make_cfg, tmp_path, group):
    cfg = make_cfg(*LM, f"group={group}", "depth=3", "model.d_model=32", "model.ffn_dim=64",
                   "probe.update_bound=true")
    summary = train(cfg, tmp_path)
    rows = pd.read_csv(tmp_path / "update_bound.csv")
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    probed = metrics.dropna(subset=["model_update"]).step.tolist()
    assert sorted(rows.step.unique()) == probed and len(rows) == len(probed) * 2 * 3
    init = rows[rows.step == 0]
    assert (init.term == 0).all() and (init.param_change == 0).all()
    alpha = deepnorm_single_stack(3)["alpha"] if group == "deepnorm" else 1.0
    assert np.allclose(rows.alpha, alpha)
    # The Xavier-gain reading of v and w at init is the init rule's gain: beta for DeepNorm, 1/k_l
    # (k_l = N + 1 - l) for Post-LN-init, 1 for Xavier (sampling noise of a 32-wide matrix aside).
    if group == "deepnorm":
        expected = pd.Series(deepnorm_single_stack(3)["beta"], index=init.index)
    elif group == "postln_init":
        expected = 1.0 / (3 + 1 - init.layer)
    else:
        expected = pd.Series(1.0, index=init.index)
    for column in ("v_gain", "w_gain"):
        assert np.allclose(init[column], expected, rtol=0.15), (column, init[column].tolist(), expected.tolist())
    # The operator-norm bound is at or above the measured relative update at every probe step.
    steps = update_bound_steps(metrics.assign(run="r"), rows.assign(run="r", group=group, depth=3, seed=0),
                               pd.DataFrame({"run": ["r"], "features_init_norm": [summary["features_init_norm"]]}))
    assert len(steps) == len(probed) - 1 and (steps.ratio >= 1).all(), steps
    assert math.isclose(summary["features_init_norm"], math.sqrt(32), rel_tol=1e-3)  # LN output, gain 1
    table = update_bound_table(steps, at=(1,))
    assert table.min_ratio.iloc[0] == steps.ratio.min()


def test_the_bound_probe_resumes_to_the_same_file(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg(*LM, "group=deepnorm", "probe.update_bound=true", "train.checkpoint_every=2")
    train(cfg, tmp_path / "reference")
    real = trainer.Run.step
    with monkeypatch.context() as m:
        m.setattr(trainer.Run, "step", lambda self, step: real(self, step) if step != 6 else 1 / 0)
        with pytest.raises(ZeroDivisionError):
            train(cfg, tmp_path / "run")
    summary = train(cfg, tmp_path / "run")
    assert summary["resumed_from"] == [4]
    assert_same_files(tmp_path / "run", tmp_path / "reference")
    assert (tmp_path / "run" / "update_bound.csv").read_bytes() == (tmp_path / "reference" / "update_bound.csv").read_bytes()


@pytest.mark.parametrize("group", ["deepnorm", "postln"])
def test_the_encoder_decoder_bound_is_theorem_4_3(make_cfg, tmp_path, group):
    cfg = make_cfg(f"group={group}", "depth=2", "decoder_depth=3", "train.steps=6", "probe.first_steps=3",
                   "probe.every=3", "probe.update_bound=true")
    summary = train(cfg, tmp_path)
    rows = pd.read_csv(tmp_path / "update_bound.csv")
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    probed = metrics.dropna(subset=["model_update"]).step.tolist()
    assert len(rows) == len(probed) * (2 * 2 + 3 * 3)
    assert (rows[rows.sublayer == "cross_attn"]["stack"] == "decoder").all()
    alphas = rows.groupby("stack").alpha.unique()
    expected = summary["constants"]["alpha"]
    assert [*alphas["encoder"]] == pytest.approx([expected["encoder"]])
    assert [*alphas["decoder"]] == pytest.approx([expected["decoder"]])
    steps = update_bound_steps(metrics.assign(run="r"), rows.assign(run="r", group=group, depth=2, seed=0),
                               pd.DataFrame({"run": ["r"], "features_init_norm": [summary["features_init_norm"]]}))
    # The sum written out: the encoder's terms carried by each cross-attention's v w / alpha_d,
    # plus every decoder sublayer's own term.
    last = rows[rows.step == probed[-1]]
    encoder, decoder = last[last["stack"] == "encoder"], last[last["stack"] == "decoder"]
    cross = decoder[decoder.sublayer == "cross_attn"]
    by_hand = (cross.v * cross.w / cross.alpha).sum() * encoder.term.sum() + decoder.term.sum()
    at_last = steps[steps.step == probed[-1]].iloc[0]
    assert at_last.bound == pytest.approx(by_hand) and at_last.encoder_bound == pytest.approx(encoder.term.sum())
    assert len(steps) == len(probed) - 1 and (steps.ratio >= 1).all(), steps


@pytest.mark.parametrize("overrides, words", [
    (["group=preln"], "group.residual postln or deepnorm"),
    ([*LM, "group=preln"], "preln"),
    ([*LM, "group=deepnorm", "probe.enabled=false"], "probe.enabled=true"),
])
def test_the_bound_probe_refuses_what_the_theorem_does_not_cover(make_cfg, tmp_path, overrides, words):
    with pytest.raises(ConfigError, match="probe.update_bound") as err:
        train(make_cfg(*overrides, "probe.update_bound=true"), tmp_path)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())


def test_the_depth_law_is_a_least_squares_line_in_log_depth():
    depths = [6, 18, 50, 100, 200]
    runs = pd.DataFrame({"group": ["deepnorm"] * 5 + ["preln"] * 5, "depth": depths * 2, "status": "completed",
                         "final_eval_loss": [5.0 - 0.2 * math.log(d) for d in depths]
                         + [4.0, 3.9, 3.95, 4.1, 4.2]})
    law = depth_law(runs).set_index("group")
    assert law.loc["deepnorm", "A"] == pytest.approx(-0.2) and law.loc["deepnorm", "B"] == pytest.approx(5.0)
    assert law.loc["deepnorm", "r2"] == pytest.approx(1.0) and law.loc["deepnorm", "best_depth"] == 200
    assert law.loc["preln", "best_depth"] == 18 and 0 <= law.loc["preln", "r2"] < 1
    diverged = runs.assign(status=["completed"] * 4 + ["diverged"] + ["completed"] * 5)
    assert depth_law(diverged).set_index("group").loc["deepnorm", "depths"] == "6,18,50,100"


def test_finished_runs_go_into_the_cells_table_once_each(make_cfg, tmp_path):
    sweep = tmp_path / "sweep"
    for depth in (2, 3):
        train(make_cfg("group=postln", f"depth={depth}"), sweep / f"depth={depth}")
    table = tmp_path / "docs" / "cells.csv"
    first = cells.record(table, [sweep], "recipe_a")
    assert len(first) == 2 and set(first.depth) == {2, 3} and (first.status == "completed").all()
    assert first.date.notna().all() and (first.setting == "").all()
    curves = cells.read(cells.curves_path(table))
    assert set(curves.step) == {0, 3, 6} and len(curves) == 6
    again = cells.record(table, [sweep], "recipe_a")  # the same cells: replaced, not added
    assert len(again) == 2 and len(cells.read(cells.curves_path(table))) == 6
    assert len(cells.record(table, [sweep], "recipe_b")) == 4
    tables = collect(sweep)
    found, found_curves = cells.from_tables(tables, "x")
    assert found.final_eval_loss.tolist() == tables["runs"].final_eval_loss.tolist()
    assert len(found_curves) == 6 and (found_curves.recipe == "x").all()
    assert cells.setting("depth=2__group=postln__robustness=lr_x0.5__train.steps=9") == \
        "robustness=lr_x0.5 train.steps=9"


def test_the_bench_measures_checkpointing_as_its_own_variant(capsys):
    _, args = parse_args(["--variants", "b:deepnorm,e:deepnorm"])
    assert args.variants == ["b:deepnorm", "e:deepnorm"]
    with pytest.raises(SystemExit) as stop:
        parse_args(["--variants", "f:deepnorm"])
    assert stop.value.code == 2 and "--variants f:deepnorm not allowed" in capsys.readouterr().err


def test_summary_fields_of_a_run_are_json(make_cfg, tmp_path):
    train(make_cfg(*LM, "group=deepnorm", "probe.update_bound=true"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["features_init_norm"] > 0
