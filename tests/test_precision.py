"""train.precision=bf16 (autocast on the training forward; weights, optimiser and probes in fp32)
and train.compile, on the CPU."""

import math

import pandas as pd
import pytest
import torch

from stabexp.train.trainer import train


def _linear_output_dtypes(monkeypatch):
    seen = []
    real = torch.nn.functional.linear

    def spy(x, w, b=None):
        out = real(x, w, b)
        seen.append((torch.is_grad_enabled(), out.dtype))
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    return seen


def test_bf16_trains_under_autocast_and_probes_in_fp32(make_cfg, tmp_path, monkeypatch):
    seen = _linear_output_dtypes(monkeypatch)
    summary = train(make_cfg("group=preln", "train.precision=bf16"), tmp_path / "bf16")
    assert summary["status"] == "completed" and summary["precision"] == "bf16"
    training = {dtype for grad, dtype in seen if grad}
    probing = {dtype for grad, dtype in seen if not grad}
    assert training == {torch.bfloat16} and probing == {torch.float32}
    monkeypatch.undo()
    fp32 = train(make_cfg("group=preln"), tmp_path / "fp32")
    a, b = (pd.read_csv(tmp_path / d / "metrics.csv") for d in ("bf16", "fp32"))
    assert a.model_update.iloc[0] == 0.0  # F(x, theta_0) against itself, both in fp32
    assert a.loss.iloc[1] != b.loss.iloc[1]  # bf16 arithmetic ...
    assert a.loss.iloc[1] == pytest.approx(b.loss.iloc[1], rel=2e-2)  # ... on the same model
    assert math.isfinite(summary["final_eval_loss"]) and fp32["status"] == "completed"


def test_bad_precision_is_refused(make_cfg):
    from stabexp.config import ConfigError, validate

    with pytest.raises(ConfigError, match="train.precision=fp16 is not allowed: one of fp32, bf16"):
        validate(make_cfg("train.precision=fp16"))


@pytest.mark.slow
def test_compile_gives_the_eager_runs_losses(make_cfg, tmp_path):
    eager = train(make_cfg("group=postln", "train.steps=3"), tmp_path / "eager")
    compiled = train(make_cfg("group=postln", "train.steps=3", "train.compile=true"), tmp_path / "compiled")
    a, b = (pd.read_csv(tmp_path / d / "metrics.csv") for d in ("eager", "compiled"))
    assert list(a.step) == list(b.step)
    for column in ("loss", "model_update", "grad_norm"):
        assert a[column].tolist() == pytest.approx(b[column].tolist(), rel=1e-4, nan_ok=True)
    assert compiled["final_eval_loss"] == pytest.approx(eager["final_eval_loss"], rel=1e-4)
