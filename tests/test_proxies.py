"""The small-scale instability proxies (Wortsman et al. 2023) and their interventions, each
against a hand computation: the largest attention logit, the output log Z, the relative update,
qk-layernorm, z-loss, AdamW with independent decay, and the LR-sensitivity metric."""

import math

import pytest
import torch

from stabexp.analysis import lr_sensitivity, lr_sensitivity_table
from stabexp.model import build_model
from stabexp.model.norms import make_norm
from stabexp.model.transformer import SelfAttention, explicit_attention, softmax_over_keys
from stabexp.probes import LayerProbe, log_z_stats, max_attention_logit
from stabexp.train.losses import z_loss
from stabexp.train.optim import build_optimizer


def _loops_max_logit(q, k, causal, key_mask=None):
    best = -math.inf
    B, H, T, D = q.shape
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(k.shape[2]):
                    if (causal and j > i) or (key_mask is not None and not key_mask[b, 0, 0, j]):
                        continue
                    best = max(best, float(sum(q[b, h, i, x] * k[b, h, j, x] for x in range(D))) / math.sqrt(D))
    return best


def test_max_attention_logit_against_loops():
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 4, 3), torch.randn(2, 2, 4, 3)
    # A huge logit that only a position the attention may not use would hold:
    q[0, 0, 0], k[0, 0, 3] = 10.0, 10.0
    for causal in (False, True):
        assert max_attention_logit(q, k, causal).item() == pytest.approx(_loops_max_logit(q, k, causal), rel=1e-5)
    key_mask = torch.tensor([True, True, True, False]).repeat(2, 1)[:, None, None, :]
    assert max_attention_logit(q, k, False, key_mask).item() == pytest.approx(
        _loops_max_logit(q, k, False, key_mask), rel=1e-5)
    assert max_attention_logit(q, k, True).item() < 300 / math.sqrt(3)


@torch.no_grad()
def _hand_qk(attn, x, qk_norm=None):
    B, T, d = x.shape
    h = attn.n_heads
    w, b = attn.qkv.weight, attn.qkv.bias
    q = (x @ w[:d].T + b[:d]).view(B, T, h, d // h).transpose(1, 2)
    k = (x @ w[d:2 * d].T + b[d:2 * d]).view(B, T, h, d // h).transpose(1, 2)
    if qk_norm:
        # LN over each head's d_h features, gain 1 and bias 0 at construction.
        q = (q - q.mean(-1, keepdim=True)) / torch.sqrt(q.var(-1, unbiased=False, keepdim=True) + 1e-5)
        k = (k - k.mean(-1, keepdim=True)) / torch.sqrt(k.var(-1, unbiased=False, keepdim=True) + 1e-5)
    return q, k


# 5 keys and 20: each side of softmax_over_keys' short-row path on a CPU.
@pytest.mark.parametrize("qk_norm,T", [(False, 5), (True, 5), (False, 20)])
def test_the_explicit_attention_shows_its_logits_with_and_without_qk_norm(qk_norm, T):
    torch.manual_seed(0)
    d, heads = 8, 2
    norms = (make_norm("layernorm", d // heads), make_norm("layernorm", d // heads), None) if qk_norm else None
    attn = SelfAttention(d, heads, causal=True, dropout=0.0, head_norms=norms)
    x = torch.randn(3, T, d) * 4
    seen = []
    attn.scores.register_forward_hook(lambda module, args, logits: seen.append(logits.amax()))
    fused = attn(x)
    assert not seen  # the fused kernel shows no logits
    with explicit_attention():
        out = attn(x)  # the probe pass: attention by hand, its logits through `scores`
    (max_logit,) = seen
    q, k = _hand_qk(attn, x, qk_norm)
    assert max_logit.item() == pytest.approx(_loops_max_logit(q, k, True), rel=1e-4)
    assert torch.allclose(out, fused, atol=1e-5)
    # The output is attention over those (normalised) q and k.
    logits = (q @ k.transpose(-1, -2) / math.sqrt(d // heads)).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    v = (x @ attn.qkv.weight.detach()[2 * d:].T + attn.qkv.bias[2 * d:]).view(3, T, heads, d // heads).transpose(1, 2)
    y = (logits.softmax(-1) @ v).transpose(1, 2).reshape(3, T, d)
    assert torch.allclose(out, attn.out(y), atol=1e-5)
    if qk_norm:  # |LN(q).LN(k)| <= d_h, so the logit is at most sqrt(d_h) while the gains are 1
        assert max_logit.item() <= math.sqrt(d // heads) + 1e-4


@pytest.mark.parametrize("keys", [10, 40])
def test_the_softmax_over_keys_is_torch_softmax_and_its_gradient(keys):
    torch.manual_seed(0)
    logits = torch.randn(4, 2, 7, keys).masked_fill(torch.rand(4, 2, 7, keys) < 0.3, -math.inf)
    logits[..., 0] = 1.0  # every row keeps a key
    mine, ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    weights = torch.randn(4, 2, 7, keys)
    (softmax_over_keys(mine) * weights).sum().backward()
    (ref.softmax(-1) * weights).sum().backward()
    assert torch.allclose(softmax_over_keys(mine), ref.softmax(-1), atol=1e-6)
    assert torch.allclose(mine.grad, ref.grad, atol=1e-6)


def test_log_z_stats_by_hand_over_real_tokens():
    logits = torch.tensor([[[0.0, 0.0], [1.0, 3.0]], [[2.0, 2.0], [50.0, 0.0]]])
    tokens = torch.tensor([[True, True], [True, False]])
    z = [math.log(2), math.log(math.e + math.e ** 3), 2 + math.log(2)]
    mean, peak = log_z_stats(logits, tokens).tolist()
    assert mean == pytest.approx(sum(z) / 3, rel=1e-5) and peak == pytest.approx(max(z), rel=1e-5)
    assert log_z_stats(logits).tolist()[1] == pytest.approx(50.0, rel=1e-5)  # no mask: every position


def test_relative_update_per_sublayer_by_hand(make_cfg):
    cfg = make_cfg()
    torch.manual_seed(0)
    model = build_model(cfg, cfg.task.vocab_size)
    probe = LayerProbe(model)
    assert torch.isnan(probe.relative_updates()).all()  # no snapshot yet
    probe.snapshot()
    keys = probe.keys
    target = keys.index(("decoder", 2, "cross_attn"))
    res = [r for *_, r in model.residuals()][target]
    with torch.no_grad():
        res.branch.out.weight.add_(0.5)
        res.branch.out.bias.add_(1.0)  # not a matrix: not part of the relative update
    after = torch.sqrt(sum((w.detach() ** 2).sum() for w in res.branch.matrices().values()))
    moved = 0.5 * math.sqrt(res.branch.out.weight.numel())
    ratios = probe.relative_updates()
    assert ratios[target].item() == pytest.approx(moved / after.item(), rel=1e-5)
    assert (ratios[torch.arange(len(keys)) != target] == 0).all()


def test_z_loss_value_and_gradient_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    predicted = torch.tensor([[True, False, True], [True, True, False]])
    value = z_loss(logits, predicted)
    log_z = torch.logsumexp(logits.detach(), -1)
    n = predicted.sum()
    assert value.item() == pytest.approx(float((log_z[predicted] ** 2).sum() / n), rel=1e-6)
    value.backward()
    # d/dy of (log Z)^2 / n = 2 log Z softmax(y) / n on predicted positions, 0 elsewhere.
    expected = 2 * log_z[..., None] * logits.detach().softmax(-1) / n * predicted[..., None]
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def test_z_loss_adds_to_the_training_loss_as_configured(make_cfg, tmp_path):
    from stabexp.train.trainer import train

    base = train(make_cfg("train.steps=1"), tmp_path / "a")
    with_z = train(make_cfg("train.steps=1", "train.z_loss=0.5"), tmp_path / "b")
    # Same init and batch: the difference is 0.5 * mean (log Z)^2 of the first batch's logits, > 0.
    assert with_z["first_loss"] > base["first_loss"] + 0.1


def test_adamw_independent_decays_by_lambda_times_lr_over_peak(make_cfg):
    cfg = make_cfg("optim=adamw_independent", "optim.weight_decay=0.1", "train.lr=0.01", "optim.eps=1e-30")
    w = torch.nn.Parameter(torch.tensor([[1.0, -2.0]]))
    model = torch.nn.Module()
    model.w = w
    opt = build_optimizer(cfg, model, torch.device("cpu"))
    lr_t = 0.004  # mid warm-up: lr_t / lr_max = 0.4
    for group in opt.param_groups:
        group["lr"] = lr_t
    w.grad = torch.tensor([[0.3, 0.7]])
    opt.step()
    # theta <- theta - lr_t * u - lambda (lr_t / lr_max) theta; Adam's first u = sign(g).
    expected = torch.tensor([[1.0, -2.0]]) * (1 - 0.1 * 0.4) - lr_t * torch.tensor([[1.0, 1.0]])
    assert torch.allclose(w.detach(), expected, atol=1e-7)


def test_lr_sensitivity_on_given_losses():
    # loss_0 = 4: the 5.0 and the diverged (NaN) runs count as 4; loss* = 2.
    assert lr_sensitivity([3.0, 2.0, float("nan"), 5.0], 4.0) == pytest.approx((1 + 0 + 2 + 2) / 4)
    assert lr_sensitivity([2.5, 2.5], 4.0) == 0.0
    assert math.isnan(lr_sensitivity([float("nan"), float("inf")], 4.0))


def test_lr_sensitivity_table_groups_runs_by_what_is_not_the_lr():
    import pandas as pd

    runs = pd.DataFrame([
        {"run": "s/experiment=x__model.qk_norm=True__train.lr=0.1", "lr": 0.1, "status": "completed", "final_eval_loss": 3.0},
        {"run": "s/experiment=x__model.qk_norm=True__train.lr=0.01", "lr": 0.01, "status": "completed", "final_eval_loss": 2.0},
        {"run": "s/experiment=x__model.qk_norm=False__train.lr=0.1", "lr": 0.1, "status": "diverged", "final_eval_loss": 9.0},
        {"run": "s/experiment=x__model.qk_norm=False__train.lr=0.01", "lr": 0.01, "status": "completed", "final_eval_loss": 2.0},
    ])
    metrics = pd.DataFrame({"run": runs.run, "step": 0, "eval_loss": 5.0})
    table = lr_sensitivity_table(runs, metrics)
    by_setting = table.groupby("setting").lr_sensitivity.first()
    assert by_setting["model.qk_norm=True"] == pytest.approx(0.5)
    assert by_setting["model.qk_norm=False"] == pytest.approx(1.5)  # diverged: loss_0 = 5


def test_adamw_independent_equilibrium_uses_the_decay_per_unit_lr(make_cfg, tmp_path):
    """Independent decay lambda is PyTorch's AdamW decay lambda / lr_max, so the equilibrium
    angular update sqrt(2 lr (lambda / lr) (1 - b1) / (1 + b1)) does not depend on the lr."""
    from stabexp.train.trainer import train

    summary = train(make_cfg("optim=adamw_independent", "optim.weight_decay=0.01", "train.lr=0.02",
                             "train.steps=1"), tmp_path)
    assert summary["optim"]["name"] == "adamw_independent"
    assert summary["theory"]["angular_update"] == pytest.approx(math.sqrt(2 * 0.01 * 0.1 / 1.9))


def test_lr_setting_comes_from_the_recorded_overrides_when_the_folder_name_is_cut():
    import pandas as pd

    from stabexp.analysis import run_setting

    run = pd.Series({"run": "sweep/experiment=x__model.qk_norm=True__probe.every=4__tr__3f9a0c1b2d",
                     "overrides": "experiment=x__model.qk_norm=True__probe.every=4__train.lr=0.1"})
    assert run_setting(run) == "model.qk_norm=True probe.every=4"
    assert run_setting(run.drop("overrides")) == "model.qk_norm=True probe.every=4 tr 3f9a0c1b2d"
