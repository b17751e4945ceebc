"""DeepNet Table 1's other rows (docs/methods.md, "Residual placements", "Initialisation rules"):
init statistics measured on built models
against each formula, per stack, layer and matrix, at two depths; the identity at init of
ReZero and Fixup; which groups build norms; the forward pieces of NormFormer, Sub-LN and DLCL."""

import math

import pytest
import torch
import torch.nn as nn

from stabexp.config import ConfigError, validate
from stabexp.data import ReverseTask
from stabexp.model import build_model, initialise
from stabexp.model.init import admin_closed_form_omega, t_fixup_constants
from stabexp.model.norms import NORM_TYPES, HeadScale
from stabexp.model.transformer import DenseHistory, SelfAttention
from stabexp.train.schedule import lr_factor

WIDE = ["model.d_model=64", "model.ffn_dim=128", "model.n_heads=2"]
DEPTHS = [(2, 3), (5, 4)]  # (N, M): N != M, so that a swapped N and M shows


def _built(make_cfg, group, n, m, *extra):
    cfg = make_cfg(f"group={group}", f"depth={n}", f"decoder_depth={m}", *WIDE, *extra)
    torch.manual_seed(0)
    model = build_model(cfg, cfg.task.vocab_size)
    task = ReverseTask(cfg.task.vocab_size, cfg.task.seq_len, 0, torch.device("cpu"))
    constants = initialise(model, cfg.group.init, lambda: task.init_batch(16))
    return model, constants


def _xavier_std(w):
    fan_out, fan_in = w.shape
    return math.sqrt(2.0 / (fan_in + fan_out))


def _check_std(model, expected_gain):
    """Each branch matrix's std against Xavier's times expected_gain(stack, layer, sublayer, name)."""
    for stack, layer, sublayer, res in model.residuals():
        for name, w in res.branch.matrices().items():
            gain = expected_gain(stack, layer, sublayer, name)
            if gain == 0:
                assert torch.count_nonzero(w) == 0, (stack, layer, sublayer, name)
                continue
            # 4096+ samples per matrix: the std estimate is within ~3% of the truth.
            measured = w.std().item() / _xavier_std(w)
            assert measured == pytest.approx(gain, rel=0.08), (stack, layer, sublayer, name)


@pytest.mark.parametrize("n, m", DEPTHS)
@pytest.mark.parametrize("init, exponent", [("ds_init", 0.5), ("ds_init_code", 0.25)])
def test_ds_init_bound_shrinks_with_the_layer_index(make_cfg, n, m, init, exponent):
    model, constants = _built(make_cfg, "ds_init", n, m, f"group.init={init}")
    for stack, layer, sublayer, res in model.residuals():
        for name, w in res.branch.matrices().items():
            fan_out, fan_in = w.shape
            bound = math.sqrt(6.0 / (fan_in + fan_out)) * layer ** -exponent
            assert w.abs().max().item() <= bound  # uniform on (-bound, bound)
            assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.08), (stack, layer, name)
    assert constants["ds_init"]["exponent"] == exponent


@pytest.mark.parametrize("n, m", DEPTHS)
def test_fixup_zeroes_the_branch_outputs_and_scales_the_inputs_by_L(make_cfg, n, m):
    model, constants = _built(make_cfg, "fixup", n, m)
    L = 2 * n + 3 * m
    assert constants["fixup"]["L"] == L
    gains = {"q": L ** (-1 / 6), "k": L ** (-1 / 6), "v": L ** (-1 / 6), "o": 0.0, "w1": L ** -0.5, "w2": 0.0}
    _check_std(model, lambda stack, layer, sub, name: gains[name])
    assert not any(m.bias is not None for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("n, m", DEPTHS)
def test_t_fixup_scales_v_o_ffn_per_stack_and_the_embeddings(make_cfg, n, m):
    model, constants = _built(make_cfg, "t_fixup", n, m)
    factor = {"encoder": 0.67 * n ** -0.25, "decoder": (9 * m) ** -0.25}
    assert constants["t_fixup"] == pytest.approx(t_fixup_constants(n, m))
    _check_std(model, lambda stack, layer, sub, name: factor[stack] if name in ("v", "o", "w1", "w2") else 1.0)
    # The shared embedding takes the encoder's (9N)^(-1/4), exactly: the same draw without it.
    assert constants["t_fixup"]["embedding"] == pytest.approx((9 * n) ** -0.25)
    unscaled, _ = _built(make_cfg, "t_fixup", n, m, "group.init=xavier")
    torch.testing.assert_close(model.embed.weight, unscaled.embed.weight * (9 * n) ** -0.25)


@pytest.mark.parametrize("n, m", DEPTHS)
def test_subln_gamma_per_stack_and_none_on_cross_attention(make_cfg, n, m):
    model, constants = _built(make_cfg, "subln", n, m)
    gamma = {"encoder": math.sqrt(math.log(3 * m) * math.log(2 * n) / 3), "decoder": math.sqrt(math.log(3 * m))}
    assert constants["subln_gamma"] == pytest.approx(gamma)
    _check_std(model, lambda stack, layer, sub, name:
               gamma[stack] if name in ("v", "o", "w1", "w2") and sub != "cross_attn" else 1.0)


@pytest.mark.parametrize("n, m", DEPTHS)
def test_deepnorm_torchscale_scales_pytorch_default_weights_and_biases(make_cfg, n, m):
    model, constants = _built(make_cfg, "deepnorm_torchscale", n, m)
    beta = {"encoder": 1.15 * (n ** 4 * m) ** (-1 / 16), "decoder": (12 * m) ** -0.25}
    assert {s: constants["deepnorm_torchscale"][s]["beta"] for s in beta} == pytest.approx(beta)
    assert {s: constants["alpha"][s] for s in beta} == pytest.approx(
        {"encoder": 0.81 * (n ** 4 * m) ** (1 / 16), "decoder": (3 * m) ** 0.25})
    for stack, layer, sub, res in model.residuals():
        biases = res.branch.biases()
        for name, w in res.branch.matrices().items():
            gain = beta[stack] if name in ("v", "o", "w1", "w2") else 1.0
            bound = gain / math.sqrt(w.shape[1])  # nn.Linear's U(+-1/sqrt(fan_in)), times beta
            assert w.abs().max().item() <= bound + 1e-7 and biases[name].abs().max().item() <= bound + 1e-7
            assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.08), (stack, layer, sub, name)


@pytest.mark.parametrize("n, m", DEPTHS)
def test_admin_closed_form_omega_per_stack(make_cfg, n, m):
    model, constants = _built(make_cfg, "admin_closed_form", n, m)
    assert admin_closed_form_omega(200) == pytest.approx(6.075, abs=1e-3)  # admin-torch's O(log n) form
    expected = {"encoder": admin_closed_form_omega(2 * n), "decoder": admin_closed_form_omega(3 * m)}
    for stack, *_, res in model.residuals():
        torch.testing.assert_close(res.omega.detach(), torch.full((64,), expected[stack]))
    assert constants["admin_closed_form"]["omega"] == pytest.approx(expected)


@pytest.mark.parametrize("n, m", DEPTHS)
def test_dlcl_starts_from_uniform_averages(make_cfg, n, m):
    model, constants = _built(make_cfg, "dlcl", n, m)
    for stack, depth in (("encoder", n), ("decoder", m)):
        w = getattr(model, f"{stack}_history").weight.detach()
        assert w.shape == (depth + 1, depth + 1)
        for l in range(depth + 1):
            torch.testing.assert_close(w[l, : l + 1], torch.full((l + 1,), 1 / (l + 1)))
            assert torch.count_nonzero(w[l, l + 1:]) == 0
        assert constants["dlcl_row_weights"][stack] == [[pytest.approx(1 / (l + 1))] for l in range(depth + 1)]


def test_dlcl_combines_the_normalised_outputs_with_its_weights():
    from stabexp.model_options import TransformerConfig

    c = TransformerConfig(vocab_size=4, d_model=8)
    history = DenseHistory(3, c)
    with torch.no_grad():
        history.weight.copy_(torch.tensor([[1, 0, 0, 0], [0.2, 0.8, 0, 0], [0.1, 0.3, 0.6, 0], [0, 0, 0, 1.0]]))
    g = torch.Generator().manual_seed(0)
    y0, y1, y2 = (torch.randn(2, 3, 8, generator=g) * 3 for _ in range(3))
    ln = lambda t: nn.functional.layer_norm(t, (8,))
    outputs = [y0]
    torch.testing.assert_close(history(outputs, y1), 0.2 * y0 + 0.8 * ln(y1))
    torch.testing.assert_close(history(outputs, y2), 0.1 * y0 + 0.3 * ln(y1) + 0.6 * ln(y2))


@pytest.mark.parametrize("group", ["rezero", "fixup"])
def test_rezero_and_fixup_are_the_identity_at_init(make_cfg, group):
    """Every branch is multiplied by 0 (ReZero's alpha) or ends in a zero matrix (Fixup), and
    neither has a norm: each stack hands its input embedding through unchanged."""
    model, _ = _built(make_cfg, group, 3, 2)
    src = torch.randint(1, 16, (4, 7))
    tgt = torch.randint(1, 16, (4, 5))
    with torch.no_grad():
        torch.testing.assert_close(model.encode(src), model._embed(src, "encoder"))
        torch.testing.assert_close(model.features(src, tgt), model._embed(tgt, "decoder"))


def test_rezero_has_one_alpha_per_layer_shared_by_its_sublayers(make_cfg):
    model, constants = _built(make_cfg, "rezero", 2, 3)
    for layer in [*model.encoder, *model.decoder]:
        subs = [layer.self_attn, getattr(layer, "cross_attn", layer.self_attn), layer.ffn]
        assert all(s.alpha is layer.self_attn.alpha for s in subs)
    alphas = {id(m.alpha) for *_, m in model.residuals()}
    assert len(alphas) == 2 + 3 and constants["rezero_alpha"] == [0.0]


def test_fixup_ffn_shifts_sit_around_the_activation(make_cfg):
    """fc2(shift3(ReLU(shift2(fc1(shift1(x)))))) times the branch scale, no biases."""
    model, _ = _built(make_cfg, "fixup", 1, 1)
    res = model.encoder[0].ffn
    ffn = res.branch
    with torch.no_grad():
        for p in ffn.parameters():
            p.normal_()
        res.shift.bias.fill_(0.3)
        ffn.pre_act.bias.fill_(-0.2)
        ffn.inner.bias.fill_(0.5)
        res.scale.weight.fill_(1.7)
        x = torch.randn(2, 3, 64)
        h = torch.relu((x + 0.3) @ ffn.fc1.weight.T - 0.2) + 0.5
        torch.testing.assert_close(res(x), x + 1.7 * (h @ ffn.fc2.weight.T))


@pytest.mark.parametrize("group, has_norm", [
    ("rezero", False), ("fixup", False), ("t_fixup", False), ("rezero_postln", True), ("sandwich", True),
    ("normformer", True), ("subln", True), ("dlcl", True), ("ds_init", True)])
def test_which_groups_build_a_norm(make_cfg, group, has_norm):
    model, constants = _built(make_cfg, group, 2, 2)
    assert any(isinstance(m, NORM_TYPES) for m in model.modules()) == has_norm
    assert (constants["norm"] is not None) == has_norm


def test_rmsnorm_replaces_every_layernorm(make_cfg):
    model, constants = _built(make_cfg, "normformer", 2, 2, "model.norm=rmsnorm")
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    # 2 LNs per self-attention, 1 per cross-attention, 2 per FFN (stream + inner), 2 final.
    assert sum(isinstance(m, nn.RMSNorm) for m in model.modules()) == 2 * (2 + 2) + 2 * (2 + 1 + 2) + 2
    assert constants["norm"] == "rmsnorm"


@pytest.mark.parametrize("group", ["rezero", "fixup", "t_fixup"])
def test_rmsnorm_without_a_norm_is_a_clear_error(make_cfg, group):
    cfg = make_cfg(f"group={group}", "model.norm=rmsnorm")
    with pytest.raises(ConfigError, match=r"model.norm=rmsnorm .*has no normalisation"):
        validate(cfg)


def test_head_scale_paper_scales_heads_before_w_o_fairseq_after():
    d, h = 8, 2
    gamma = torch.tensor([2.0, 0.5])
    torch.manual_seed(0)
    plain = SelfAttention(d, h, False, 0.0)
    paper = SelfAttention(d, h, False, 0.0, inner=HeadScale(h))
    fairseq = SelfAttention(d, h, False, 0.0, post=HeadScale(h))
    per_dim = gamma.repeat_interleave(d // h)
    with torch.no_grad():
        for a in (paper, fairseq):
            a.load_state_dict(plain.state_dict(), strict=False)
            next(m for m in a.modules() if isinstance(m, HeadScale)).gamma.copy_(gamma)
        # Scaling head h before W_O = scaling W_O's columns of head h; after = its rows and bias.
        before = SelfAttention(d, h, False, 0.0)
        before.load_state_dict(plain.state_dict())
        before.out.weight.mul_(per_dim[None, :])
        after = SelfAttention(d, h, False, 0.0)
        after.load_state_dict(plain.state_dict())
        after.out.weight.mul_(per_dim[:, None])
        after.out.bias.mul_(per_dim)
        x = torch.randn(3, 5, d)
        torch.testing.assert_close(paper(x), before(x))
        torch.testing.assert_close(fairseq(x), after(x))
        assert not torch.allclose(paper(x), fairseq(x), atol=1e-4)


def test_subln_and_normformer_put_their_inner_norms_where_the_papers_do(make_cfg):
    for group, attn_inner, attn_post in (("subln", NORM_TYPES, None), ("normformer", HeadScale, None),
                                         ("normformer_fairseq", None, HeadScale)):
        model, _ = _built(make_cfg, "normformer" if group.startswith("normformer") else group, 2, 2,
                          f"group.residual={group}")
        for stack, _, sub, res in model.residuals():
            if sub == "self_attn":
                assert (attn_inner is None) == isinstance(res.branch.inner, nn.Identity)
                assert attn_inner is None or isinstance(res.branch.inner, attn_inner)
                assert (attn_post is None) == isinstance(res.branch.post, nn.Identity)
                # NormFormer's post-attention LN sits on the branch output (Sandwich's shape).
                assert hasattr(res, "ln_out") == group.startswith("normformer")
            if sub == "ffn":  # both: an LN of width ffn_dim after the activation
                assert isinstance(res.branch.inner, NORM_TYPES) and res.branch.inner.normalized_shape == (128,)


def test_t_fixup_schedule_has_no_warmup():
    assert lr_factor("inverse_sqrt_nowarmup", 1, 100, decay_period=4000) == 1.0
    assert lr_factor("inverse_sqrt_nowarmup", 4001, 100, decay_period=4000) == pytest.approx(math.sqrt(0.5))
