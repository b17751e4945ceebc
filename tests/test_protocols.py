"""The papers' own protocols: fairseq's warm-up from a start lr, runs without BLEU,
probes at init averaged over draws and batches, Transformer-Clinic's curve along one encoder,
and fits reported with their spread over seeds."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from corpus import translation_overrides

from stabexp.analysis import clinic_fits, clinic_ratio, encoder_input_change, spread, w2_grad_slopes
from stabexp.config import ConfigError, validate
from stabexp.data import make_task
from stabexp.model import build_model, initialise
from stabexp.probes.at_init import grad_at_init, mean_of, output_change
from stabexp.train.schedule import lr_factor
from stabexp.train.trainer import train


def test_warmup_from_a_start_lr_is_fairseqs_inverse_sqrt_update_for_update():
    """fairseq sets warmup_init_lr before update 1 and steps the scheduler after each update:
    update t runs at init + (t - 1) (peak - init) / W, and from t = W + 1 at peak sqrt(W / (t - 1))."""
    peak, init, warmup = 5e-4, 1e-7, 4000
    lr = [peak * lr_factor("warmup_inverse_sqrt", t, warmup, init / peak) for t in (1, 2, 30, 4001, 4002, 16001)]
    step = (peak - init) / warmup
    assert lr == pytest.approx([init, init + step, init + 29 * step, peak, peak * math.sqrt(4000 / 4001),
                                peak / 2], rel=1e-12)
    # Without a start lr the schedule is today's; a constant schedule ignores the start lr.
    assert lr_factor("warmup_inverse_sqrt", 1, 4, None) == 0.25
    assert lr_factor("constant", 1, 4000, 1e-7 / peak) == 1.0


def test_the_lr_column_starts_at_warmup_init_lr(make_cfg, tmp_path):
    train(make_cfg("group=postln_warmup", "train.lr=0.01", "train.warmup_steps=4", "train.warmup_init_lr=0.001",
                   "probe.every=1"), tmp_path)
    lr = pd.read_csv(tmp_path / "metrics.csv").set_index("step").lr
    assert lr.loc[1:].tolist() == pytest.approx([0.001, 0.00325, 0.0055, 0.00775, 0.01, 0.01 * math.sqrt(4 / 5)])


@pytest.mark.parametrize("override, message", [
    ("train.warmup_init_lr=0.5", "train.warmup_init_lr=0.5 is not allowed: must be in [0, train.lr=0.001]"),
    ("probe.perturbation_draws=0", "probe.perturbation_draws=0 is not allowed: must be an integer >= 1"),
    ("probe.grad_batches=-1", "probe.grad_batches=-1 is not allowed: must be >= 0"),
])
def test_bad_protocol_values_are_one_line(make_cfg, override, message):
    # The at-init probe checks its own keys (probes/at_init.py), so it is on here.
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(make_cfg(override, "probe.at_init=true"))


def test_a_translation_run_without_bleu_scores_losses_and_translates_nothing(make_cfg, corpus_dir, tmp_path):
    summary = train(make_cfg(*translation_overrides(corpus_dir), "task.bleu=false", "train.steps=3"), tmp_path)
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert metrics.valid_bleu.isna().all() and metrics.eval_loss.notna().any()
    assert summary["test_loss"] > 0 and "test_bleu" not in summary and summary["data"]["valid_bleu_sentences"] == 0
    assert not (tmp_path / "test_translations.tsv").exists()


def test_a_run_of_zero_steps_measures_at_init_only(make_cfg, tmp_path):
    summary = train(make_cfg("train.steps=0", "probe.at_init=true"), tmp_path)
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert len(metrics) == 1 and metrics.output_change.iloc[0] > 0 and metrics.eval_loss.isna().all()
    assert summary["status"] == "completed" and summary["final_eval_loss"] is None


def _model_and_task(make_cfg, *overrides):
    cfg = make_cfg("group=postln", *overrides)
    task = make_task(cfg, torch.device("cpu"))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task.vocab_size, task.pad_id, task.max_positions)
    initialise(model, cfg.group.init, task.init_batch)
    return cfg, task, model


def test_at_init_probes_are_the_mean_over_draws_and_batches(make_cfg, tmp_path):
    """probe.perturbation_draws=3 writes the mean of three draws of delta from the seed's
    generator; probe.grad_batches=2 the mean gradient norms of the first two init batches."""
    cfg, task, model = _model_and_task(make_cfg, "train.steps=0", "probe.at_init=true",
                                       "probe.perturbation_draws=3", "probe.grad_batches=2")
    src, tgt_in, _ = task.probe_batch()
    generator = torch.Generator().manual_seed(cfg.seed)
    draws = [output_change(model, src, tgt_in, generator=generator) for _ in range(3)]
    grads = [grad_at_init(model, task.init_batch(), task.loss) for _ in range(2)]
    assert len({d["output_change"] for d in draws}) == 3  # three different deltas
    train(cfg, tmp_path)
    metrics = pd.read_csv(tmp_path / "metrics.csv").iloc[0]
    layers = pd.read_csv(tmp_path / "layers.csv")
    assert metrics.output_change == pytest.approx(np.mean([d["output_change"] for d in draws]), rel=1e-6)
    assert metrics.grad_norm == pytest.approx(np.mean([g["grad_norm"] for g in grads]), rel=1e-6)
    assert layers.input_change.tolist() == pytest.approx(np.mean([d["input_change"] for d in draws], 0), rel=1e-6)
    assert mean_of([{"a": [1.0, None]}, {"a": [3.0, None]}]) == {"a": [2.0, None]}


def test_grad_batches_zero_skips_the_gradient_at_init(make_cfg, tmp_path):
    train(make_cfg("train.steps=0", "probe.at_init=true", "probe.grad_batches=0"), tmp_path)
    metrics, layers = pd.read_csv(tmp_path / "metrics.csv"), pd.read_csv(tmp_path / "layers.csv")
    assert metrics.output_change.iloc[0] > 0 and metrics.grad_norm.isna().all()
    assert layers.input_change.gt(0).all() and layers.grad_norm.isna().all() and layers.w2_grad_norm.isna().all()


def test_the_encoder_curve_is_independent_of_the_decoder(make_cfg):
    """Clinic's curve uses the encoder alone: the same embeddings and encoder under a 1- or a
    3-layer decoder give the same input changes (delta is drawn in parameter order, embeddings
    and encoder first, so both models get the same delta there)."""
    models = {}
    for decoder_depth in (3, 1):
        cfg, task, models[decoder_depth] = _model_and_task(make_cfg, "depth=3", f"decoder_depth={decoder_depth}")
    shared = {k: v for k, v in models[3].state_dict().items() if k.startswith(("embed", "encoder"))}
    models[1].load_state_dict(shared, strict=False)
    src, tgt_in, _ = task.probe_batch()
    curves = []
    for model in models.values():
        change = output_change(model, src, tgt_in, generator=torch.Generator().manual_seed(0))
        encoder = [i for i, (stack, *_) in enumerate(model.residuals()) if stack == "encoder"]
        curves.append([change["input_change"][i] for i in encoder])
    assert len(curves[0]) == 6 and curves[0][0] > 0 and curves[0] == pytest.approx(curves[1], rel=1e-6)


def _curves(shape, seeds=3, sublayers=200, model="tiny", noise=0.0):
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(seeds):
        for i in range(1, sublayers + 1):
            value = shape(i) * (1 + seed / 10) + noise * rng.normal()
            rows.append({"run": f"{model}{shape.__name__}{seed}", "model": model, "depth": sublayers // 2,
                         "seed": seed, "index": i, "input_change": value})
    return rows


def test_clinic_fits_average_the_seeds_then_fit_and_give_the_per_seed_range():
    def linear(i):
        return 10.0 * i

    def logarithmic(i):
        return 5.0 + 30.0 * np.log(i)
    curves = pd.DataFrame([{**r, "group": "postln"} for r in _curves(linear)]
                          + [{**r, "group": "preln"} for r in _curves(logarithmic, noise=1.0)])
    fits = clinic_fits(curves).set_index("group")
    assert fits.loc["postln", "linear_r2"] == pytest.approx(1.0) and fits.loc["postln", "log_r2"] < 0.9
    assert fits.loc["preln", "log_r2"] > 0.99 and fits.loc["preln", "linear_r2"] < fits.loc["preln", "log_r2"]
    assert fits.loc["postln", "runs"] == 3 and fits.loc["postln", "sublayers"] == 200
    low, high = map(float, fits.loc["preln", "seed_log_r2"].split("-"))
    assert 0.9 < low <= high <= 1.0
    # Means over seeds 1.0, 1.1, 1.2 times the curve: mean factor 1.1.
    assert fits.loc["postln", "change_at_last"] == pytest.approx(2000 * 1.1)
    ratio = clinic_ratio(curves).iloc[0]
    expected = 2000.0 / (5 + 30 * np.log(200))
    assert ratio.ratio == pytest.approx(expected, rel=1e-2) and ratio.seeds == 3
    low, high = map(float, ratio.seed_range.split("-"))
    assert expected * 0.98 < low <= high < expected * 1.02


def test_encoder_input_change_numbers_the_encoder_sublayers_bottom_up():
    rows = []
    for stack, n in (("encoder", 4), ("decoder", 3)):
        for k in range(n):
            rows.append({"run": "r", "group": "postln", "model": "tiny", "depth": 2, "seed": 0, "step": 0,
                         "stack": stack, "param": np.nan, "input_change": float(k + 1)})
    rows.append({"run": "r", "group": "postln", "model": "tiny", "depth": 2, "seed": 0, "step": 5,
                 "stack": "encoder", "param": np.nan, "input_change": np.nan})
    curve = encoder_input_change(pd.DataFrame(rows))
    assert curve["index"].tolist() == [1, 2, 3, 4] and curve.input_change.tolist() == [1, 2, 3, 4]


def test_a_slope_comes_with_its_spread_over_seeds():
    depths = [6, 25, 100]
    rows = [{"group": "preln", "depth": d, "seed": s, "w2_grad_norm": d ** slope}
            for s, slope in enumerate([-0.4, -0.5, -0.6]) for d in depths]
    fit = w2_grad_slopes(pd.DataFrame(rows)).iloc[0]
    assert fit.seeds == 3 and fit.seed_slope_min == pytest.approx(-0.6) and fit.seed_slope_max == pytest.approx(-0.4)
    assert fit.seed_slope_sd == pytest.approx(0.1) and fit.slope == pytest.approx(-0.5)
    assert spread([1.0, 2.0, 3.0]) == {"mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0, "n": 3}
