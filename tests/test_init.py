"""Init rules measured on built models: per-layer weight scales and Admin's profiling."""

import math

import pytest
import torch

from stabexp.data import make_task
from stabexp.model import build_model, initialise
from stabexp.model.init import deepnorm_encoder_decoder

WIDE = ["model.d_model=64", "model.ffn_dim=128", "model.n_heads=2"]


def _built(make_cfg, group, depth, seed=0, decoder_depth=None):
    cfg = make_cfg(f"group={group}", f"depth={depth}", f"decoder_depth={decoder_depth or depth}", f"seed={seed}", *WIDE)
    torch.manual_seed(seed)
    model = build_model(cfg, cfg.task.vocab_size)
    task = make_task(cfg, torch.device("cpu"))
    constants = initialise(model, cfg.group.init, lambda: task.init_batch(16))
    return model, constants


def _xavier_std(w):
    fan_out, fan_in = w.shape
    return math.sqrt(2.0 / (fan_in + fan_out))


def test_postln_init_divides_layer_l_by_depth_plus_one_minus_l(make_cfg):
    """Each stack by its own depth: N = 3 encoder layers, M = 5 decoder layers."""
    depths = {"encoder": 3, "decoder": 5}
    model, _ = _built(make_cfg, "postln_init", 3, decoder_depth=5)
    for stack, layer, _, res in model.residuals():
        k = depths[stack] + 1 - layer
        for name, w in res.branch.matrices().items():
            measured = w.std().item() / _xavier_std(w)
            # 4096+ samples per matrix: the std estimate is within ~3% of the truth.
            assert measured == pytest.approx(1.0 / k, rel=0.08), (stack, layer, name)


def test_xavier_is_unscaled(make_cfg):
    model, _ = _built(make_cfg, "postln_warmup", 3)
    for stack, layer, _, res in model.residuals():
        for name, w in res.branch.matrices().items():
            assert w.std().item() / _xavier_std(w) == pytest.approx(1.0, rel=0.08), (stack, layer, name)


def test_deepnorm_gains(make_cfg):
    """At N = 3, M = 5, so that swapping N and M in a formula shows."""
    model, constants = _built(make_cfg, "deepnorm", 3, decoder_depth=5)
    expected = deepnorm_encoder_decoder(3, 5)
    assert expected["encoder"]["beta"] == pytest.approx(0.87 * (3 ** 4 * 5) ** (-1 / 16))
    assert expected["decoder"]["beta"] == pytest.approx((12 * 5) ** -0.25)
    assert {res.alpha for stack, _, _, res in model.residuals() if stack == "decoder"} == {(3 * 5) ** 0.25}
    assert constants["deepnorm"] == expected
    seen = set()
    for stack, layer, sublayer, res in model.residuals():
        for name, w in res.branch.matrices().items():
            gain = expected[stack]["beta"] if name in ("v", "o", "w1", "w2") else 1.0
            measured = w.std().item() / _xavier_std(w)
            assert measured == pytest.approx(gain, rel=0.08), (stack, layer, sublayer, name)
            seen.add((stack, sublayer, name))
    # The decoder's cross-attention V and O are scaled too.
    assert ("decoder", "cross_attn", "v") in seen and ("decoder", "cross_attn", "o") in seen


def test_admin_profiling_recursion(make_cfg):
    """Re-run the profiling batch with hooks and check omega_1 = 1 and
    omega_{i+1} = sqrt(Var(omega_i x_i) + Var(G_i(x_i))) in each stack, bottom-up."""
    cfg = make_cfg("group=admin", "depth=3", *WIDE)
    torch.manual_seed(0)
    model = build_model(cfg, cfg.task.vocab_size)
    task = make_task(cfg, torch.device("cpu"))
    batch = task.init_batch(16)
    constants = initialise(model, "admin_profiled", lambda: batch)
    seen = {"encoder": [], "decoder": []}
    hooks = []
    for stack, _, _, res in model.residuals():
        def keep_input(module, inputs, stack=stack):  # omega_i and x_i
            seen[stack].append((module.omega.detach().clone(), inputs[0].detach()))

        def keep_branch(module, inputs, output, stack=stack):  # G_i(x_i)
            seen[stack][-1] = (*seen[stack][-1], output.detach())

        hooks.append(res.register_forward_pre_hook(keep_input))
        hooks.append(res.branch.register_forward_hook(keep_branch))
    with torch.no_grad():
        model(batch[0], batch[1])
    for h in hooks:
        h.remove()
    for stack in ("encoder", "decoder"):
        omegas = constants["admin_omega"][stack]
        assert len(omegas) == len(seen[stack]) == (6 if stack == "encoder" else 9)
        ratio = 1.0
        for i, (omega, x, g) in enumerate(seen[stack]):
            assert torch.all(omega == omega[0]), "omega is a vector filled with one scalar"
            assert omega[0].item() == pytest.approx(ratio, rel=1e-5), (stack, i)
            assert omegas[i] == pytest.approx(ratio, rel=1e-5)
            ratio = math.sqrt(torch.var(omega * x, unbiased=False).item() + torch.var(g, unbiased=False).item())
        assert omegas[0] == 1.0 and omegas[-1] > 1.0


def test_admin_omega_is_learnable(make_cfg):
    model, _ = _built(make_cfg, "admin", 2)
    omegas = [res.omega for *_, res in model.residuals()]
    assert all(o.requires_grad and o.shape == (64,) for o in omegas)
    assert any(o is p for o in omegas for p in model.parameters())
