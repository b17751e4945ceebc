"""Probes at initialisation: Admin's output change and the gradient at init."""

import pandas as pd
import pytest
import torch

from stabexp.data import make_task
from stabexp.model import build_model, initialise
from stabexp.probes.at_init import grad_at_init, output_change, perturbed_parameters
from stabexp.train.trainer import train


def _model(make_cfg, group, depth=3, seed=0):
    cfg = make_cfg(f"group={group}", f"depth={depth}", f"seed={seed}")
    torch.manual_seed(seed)
    model = build_model(cfg, cfg.task.vocab_size)
    task = make_task(cfg, torch.device("cpu"))
    initialise(model, cfg.group.init, lambda: task.init_batch(cfg.train.batch_size))
    return cfg, model, task


def test_perturbed_parameters_are_the_weights_only(make_cfg):
    _, model, _ = _model(make_cfg, "admin")
    chosen = {id(p) for p in perturbed_parameters(model)}
    names = {n for n, p in model.named_parameters() if id(p) in chosen}
    assert "embed.weight" in names and "encoder.0.self_attn.branch.qkv.weight" in names
    assert not any(n.endswith(("bias", "omega")) or ".ln." in n for n in names)


def test_output_change_is_zero_without_perturbation_and_restores_the_weights(make_cfg):
    _, model, task = _model(make_cfg, "postln")
    src, tgt_in, _ = task.probe_batch(4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    zero = output_change(model, src, tgt_in, scale=0.0)
    assert zero["output_change"] == 0.0 and all(c == 0.0 for c in zero["input_change"])
    result = output_change(model, src, tgt_in, generator=torch.Generator().manual_seed(0))
    assert result["output_change"] > 0 and len(result["input_change"]) == 3 * 2 + 3 * 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_output_change_is_quadratic_in_a_small_perturbation(make_cfg):
    _, model, task = _model(make_cfg, "preln")
    src, tgt_in, _ = task.probe_batch(4)
    small = output_change(model, src, tgt_in, 1e-4, torch.Generator().manual_seed(1))
    double = output_change(model, src, tgt_in, 2e-4, torch.Generator().manual_seed(1))
    assert double["output_change"] / small["output_change"] == pytest.approx(4.0, rel=0.1)


def test_grad_at_init_matches_the_trainers_first_gradient(make_cfg, tmp_path):
    cfg, model, task = _model(make_cfg, "postln_init")
    probe = grad_at_init(model, task.train_batch(cfg.train.batch_size))
    assert all(p.grad is None for p in model.parameters())
    train(cfg, tmp_path)
    layers = pd.read_csv(tmp_path / "layers.csv")
    first = layers[layers.step == 1]
    assert first.grad_norm.tolist() == pytest.approx(probe["sublayer_grad_norm"], rel=1e-5)
    metrics = pd.read_csv(tmp_path / "metrics.csv").set_index("step")
    assert metrics.loc[1, "grad_norm"] == pytest.approx(probe["grad_norm"], rel=1e-5)
    w2 = [w for w, name in zip(probe["w2_grad_norm"], first.sublayer) if name == "ffn"]
    assert len(w2) == 3 + 3 and all(w is not None and w > 0 for w in w2)
    assert all(w is None for w, name in zip(probe["w2_grad_norm"], first.sublayer) if name != "ffn")
