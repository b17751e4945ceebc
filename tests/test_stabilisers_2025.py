"""The stabilisers of 2024-2025 (docs/methods.md, "Residual placements" and "Optimisers"):
each placement's forward against its paper's formula with a stub branch, the layers Mix-LN and
HybridNorm* mix, DyT, the layer-importance probe, QK-Clip and Muon; and every new group run
decoder-only with every probe."""

import json
import math

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import OmegaConf

from stabexp.paths import conf_dir
from stabexp.model import build_model
from stabexp.model.norms import DyT
from stabexp.model.placements import PLACEMENTS, Plain, PostLN, PreLN, Sandwich
from stabexp.model_options import TransformerConfig
from stabexp.probes.layer_importance import layer_importance
from stabexp.train.optim import MuonAdamW, branch_matrices, build_optimizer
from stabexp.train.qk_clip import QKClip
from stabexp.train.trainer import train

D = 8
G = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(1))
NEW_GROUPS = sorted(p.stem for p in (conf_dir() / "group").glob("*.yaml")
                    if not PLACEMENTS[OmegaConf.load(p).residual].encoder_decoder)
LM = ["model.arch=decoder_only", "task=lm"]


class Stub(nn.Module):
    def forward(self, x):
        self.seen = x
        return G


def _ln(x):
    return F.layer_norm(x, (D,))


@pytest.fixture
def x():
    return torch.randn(3, 5, D, generator=torch.Generator().manual_seed(0)) * 3 + 1


@pytest.mark.parametrize("style, layer, expected, seen", [
    ("peri_ln", 1, lambda x: x + _ln(G), _ln),                                     # Peri-LN
    ("reordered_norm", 1, lambda x: x + _ln(G), lambda x: x),                      # OLMo 2
    ("layernorm_scaled", 4, lambda x: x + G, lambda x: _ln(x) / 2.0),              # LNS, 1/sqrt(4)
    ("layernorm_scaled", 1, lambda x: x + G, _ln),
    ("hybridnorm", 1, lambda x: _ln(x) + G, _ln),                                  # HybridNorm FFN
])
def test_each_new_placement_combines_x_and_its_branch_as_the_paper_writes(x, style, layer, expected, seen):
    c = TransformerConfig(vocab_size=4, d_model=D, residual=style)
    res = PLACEMENTS[style].residual(Stub(), c, "decoder", {}, layer)
    torch.testing.assert_close(res(x), expected(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res.branch.seen, seen(x), rtol=1e-5, atol=1e-5)


def _lm(make_cfg, group, *overrides):
    cfg = make_cfg(f"group={group}", *LM, *overrides)
    return build_model(cfg, cfg.task.vocab_size), cfg


@pytest.mark.parametrize("depth, ratio, post", [(8, 0.25, 2), (12, 0.25, 3), (4, 0.0, 0), (5, 1.0, 5)])
def test_mix_ln_is_post_ln_in_the_bottom_floor_a_l_layers_and_pre_ln_above(make_cfg, depth, ratio, post):
    model, _ = _lm(make_cfg, "mix_ln", f"depth={depth}", f"group.mix_ratio={ratio}")
    kinds = [type(layer.ffn) for layer in model.decoder]
    assert kinds == [PostLN] * post + [PreLN] * (depth - post)
    assert all(type(layer.self_attn) is kind for layer, kind in zip(model.decoder, kinds))
    assert isinstance(model.decoder_final_ln, nn.LayerNorm)


def test_layernorm_scaling_gives_layer_l_the_factor_1_over_sqrt_l(make_cfg):
    model, _ = _lm(make_cfg, "layernorm_scaled", "depth=4")
    for i, layer in enumerate(model.decoder, start=1):
        assert layer.self_attn.depth_scale == layer.ffn.depth_scale == pytest.approx(i ** -0.5)


def test_hybridnorm_normalises_q_k_v_without_a_pre_norm_and_hybridnorm_star_pre_norms_block_0(make_cfg):
    model, _ = _lm(make_cfg, "hybridnorm", "depth=3")
    for layer in model.decoder:
        attn = layer.self_attn.branch
        assert type(layer.self_attn) is Plain and attn.v_norm is not None and attn.q_norm is not None
        assert attn.q_norm.normalized_shape == (16 // 2,)  # per head
    # The v norm is on the path: with its gain and bias at 0 the heads output nothing, and the
    # attention branch gives W_O's bias alone.
    attn = model.decoder[0].self_attn.branch
    with torch.no_grad():
        attn.v_norm.weight.zero_()
        attn.v_norm.bias.zero_()
    out = attn(torch.randn(2, 5, 16))
    torch.testing.assert_close(out, attn.out.bias.expand_as(out))
    star, _ = _lm(make_cfg, "hybridnorm_star", "depth=3")
    first, rest = star.decoder[0], star.decoder[1:]
    assert type(first.self_attn) is PreLN and type(first.ffn) is PreLN and first.self_attn.branch.v_norm is not None
    assert all(type(layer.ffn) is type(model.decoder[0].ffn) for layer in rest)


def test_peri_ln_normalises_the_embedding_output(make_cfg):
    model, _ = _lm(make_cfg, "peri_ln")
    with torch.no_grad():
        model.embed_norm["decoder"].weight.fill_(3.0)
    x = model._embed(torch.randint(1, 10, (2, 5)), "decoder")
    torch.testing.assert_close(x.std(-1, unbiased=False), torch.full((2, 5), 3.0), rtol=1e-3, atol=1e-3)
    plain, _ = _lm(make_cfg, "preln")
    assert plain.embed_norm is None


def test_the_new_placements_are_refused_on_the_encoder_decoder(make_cfg, stabexp_main):
    from conftest import one_line_error

    r = stabexp_main("run", "group=peri_ln")
    assert r.returncode == 2
    one_line_error(r, "group.residual=peri_ln", "decoder_only")


def test_dyt_is_gamma_tanh_alpha_x_plus_beta_with_alpha_0_per_site(make_cfg):
    norm = DyT(D, alpha=0.7)
    with torch.no_grad():
        norm.weight.fill_(2.0)
        norm.bias.fill_(-1.0)
    x = torch.randn(4, D)
    torch.testing.assert_close(norm(x), 2.0 * torch.tanh(0.7 * x) - 1.0)
    model, cfg = _lm(make_cfg, "preln", "model.norm=dyt", "model.dyt_alpha_attn=0.8", "model.dyt_alpha_ffn=0.2",
                     "model.learnable_embed_scale=true")
    assert not any(isinstance(m, (nn.LayerNorm, nn.RMSNorm)) for m in model.modules())
    for layer in model.decoder:
        assert layer.self_attn.ln.alpha.item() == pytest.approx(0.8)
        assert layer.ffn.ln.alpha.item() == pytest.approx(0.2)
    assert model.decoder_final_ln.alpha.item() == pytest.approx(0.5)  # dyt_alpha_final unset: dyt_alpha
    assert model.embed_scale.item() == pytest.approx(math.sqrt(16)) and model.embed_scale.requires_grad
    group, _ = _lm(make_cfg, "dyt")  # the group: Pre-LN with DyT whatever model.norm says
    assert isinstance(group.decoder[0].self_attn.ln, DyT) and isinstance(group.decoder_final_ln, DyT)


def test_skipping_a_layer_is_the_same_as_running_the_model_without_it(make_cfg):
    model, cfg = _lm(make_cfg, "preln", "depth=3")
    model.eval()
    tokens = torch.randint(1, cfg.task.vocab_size, (4, 6))

    def eval_loss(m):
        with torch.no_grad():
            logits = m(tokens[:, :0], tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()

    rows = layer_importance(model, eval_loss)
    assert [(r["stack"], r["layer"]) for r in rows] == [("decoder", 1), ("decoder", 2), ("decoder", 3)]
    full = eval_loss(model)
    layers = model.decoder
    model.decoder = nn.ModuleList([layers[0], layers[2]])  # layer 2 taken out by hand
    without = eval_loss(model)
    model.decoder = layers
    assert rows[1]["full_eval_loss"] == pytest.approx(full)
    assert rows[1]["eval_loss"] == pytest.approx(without, rel=1e-6)
    assert rows[1]["loss_increase"] == pytest.approx(without - full, abs=1e-6)


def test_qk_clip_brings_every_heads_largest_logit_of_the_step_down_to_tau(make_cfg):
    # One layer: its input, and so its logits on the same batch, move only by the clip.
    model, cfg = _lm(make_cfg, "preln", "depth=1")
    with torch.no_grad():  # large q, k: logits far above tau
        for layer in model.decoder:
            layer.self_attn.branch.qkv.weight.mul_(8.0)
    tokens = torch.randint(1, cfg.task.vocab_size, (4, 6))
    clip = QKClip(model, tau=3.0)
    with clip.observing():
        model(tokens[:, :0], tokens)
    before = [m.clone() for m in clip.max_logits]
    assert max(m.max().item() for m in before) > 3.0
    v_before = [layer.self_attn.branch.matrices()["v"].clone() for layer in model.decoder]
    clip.clip()
    with clip.observing():
        model(tokens[:, :0], tokens)
    for b, a in zip(before, clip.max_logits):
        expected = b.clamp(max=3.0)  # a head above tau lands on tau, one below keeps its logits
        torch.testing.assert_close(a, expected, rtol=1e-4, atol=1e-4)
    for layer, v in zip(model.decoder, v_before):
        assert torch.equal(layer.self_attn.branch.matrices()["v"], v)


@pytest.mark.filterwarnings("ignore:Detected call of")  # the schedule made after a step, on purpose
def test_muon_orthogonalises_the_branch_matrices_and_adamw_takes_the_rest(make_cfg):
    torch.manual_seed(0)  # the model's default init and the tokens: not whatever ran before in this process
    model, cfg = _lm(make_cfg, "preln", "depth=2", "optim=muon", "optim.weight_decay=0")
    opt = build_optimizer(cfg, model, torch.device("cpu"))
    assert isinstance(opt, MuonAdamW)
    muon = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    assert muon == {id(p) for p in branch_matrices(model)}
    adamw = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    assert not muon & adamw and muon | adamw == {id(p) for p in model.parameters()}
    w = model.decoder[0].ffn.branch.fc1.weight
    before = w.detach().clone()
    matrices = branch_matrices(model)
    all_before = [m.detach().clone() for m in matrices]
    tokens = torch.randint(1, cfg.task.vocab_size, (4, 6))
    F.cross_entropy(model(tokens[:, :0], tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    opt.step()
    # Moonlight's RMS matching: every matrix, whatever its shape (3d x d, d x d, d_ff x d,
    # d x d_ff), moves by an update of RMS about 0.2 lr (Keller Jordan's original scaling,
    # sqrt(max(1, A / B)), gives 0.16-0.24 here).
    rms = torch.stack([(b - m.detach()).pow(2).mean().sqrt() for b, m in zip(all_before, matrices)]) / cfg.train.lr
    assert rms.min() > 0.15 and rms.max() < 0.2 and rms.max() / rms.min() < 1.2
    # One step from rest: the update is lr * 0.2 sqrt(max(A, B)) times NS(g), whose singular
    # values Newton-Schulz brings near 1 (Adam's would spread with the gradient's): five steps of
    # Muon's quintic (3.4445, -4.7750, 2.0315; Jordan et al. 2024, torch.optim.Muon) map every singular value above 1% of the Frobenius
    # norm into [0.68, 1.13], a spread of at most 1.66.
    update = (before - w.detach()) / (cfg.train.lr * 0.2 * math.sqrt(max(w.shape)))
    s, g = torch.linalg.svdvals(update), torch.linalg.svdvals(w.grad)
    assert 0.6 < s.median() < 1.3 and s.max() / s.median() < 1.7
    assert (s.max() / s.median()) < (g.max() / g.median())
    state = opt.state_dict()
    assert set(state) == {"muon", "adamw"}
    opt.load_state_dict(state)
    # The lr schedule reaches both optimisers, after a load too.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 ** (i + 1))
    sched.step()
    assert opt.muon.param_groups[0]["lr"] == opt.adamw.param_groups[0]["lr"] == pytest.approx(cfg.train.lr / 4)


@pytest.mark.parametrize("group", NEW_GROUPS)
def test_every_new_group_runs_decoder_only_with_the_layer_probes(make_cfg, tmp_path, group):
    cfg = make_cfg(f"group={group}", *LM, "depth=2", "train.steps=3", "probe.at_init=true",
                   "probe.layer_importance=true")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed"
    layers = pd.read_csv(tmp_path / "layers.csv")
    last = layers[layers.step == 3]
    attention = last[last.sublayer == "self_attn"]
    assert len(last) == 2 * 2 and last.grad_norm.gt(0).all() and attention.max_attn_logit.notna().all()
    # The LN input is that of a norm on the stream, empty where a sublayer has none (OLMo 2's
    # reordered norm, HybridNorm's attention).
    model = build_model(cfg, cfg.task.vocab_size)
    on_stream = {(layer, name): hasattr(res, "ln") for _, layer, name, res in model.residuals()}
    pre_norm = {(layer, name): isinstance(res, (PreLN, Sandwich)) for _, layer, name, res in model.residuals()}
    for row in last.itertuples():
        assert (row.ln_input_norm > 0) if on_stream[row.layer, row.sublayer] else math.isnan(row.ln_input_norm)
        assert row.stream_norm > 0
        if pre_norm[row.layer, row.sublayer]:  # the norm reads the stream itself
            assert row.stream_norm == pytest.approx(row.ln_input_norm, rel=1e-6)
    assert any(on_stream.values()) != (group == "reordered_norm")
    importance = pd.read_csv(tmp_path / "layer_importance.csv")
    assert importance.step.tolist() == [0] * 2 + [3] * 2 and importance.loss_increase.notna().all()
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["constants"]["residual"] == group


def test_muon_with_qk_clip_resumes_to_the_same_files(make_cfg, tmp_path, monkeypatch):
    from conftest import assert_same_files, fail_at_step
    import stabexp.train.trainer as trainer

    cfg = make_cfg("group=peri_ln", *LM, "optim=muon", "train.qk_clip_tau=2.0", "train.lr=0.01",
                   "model.dropout=0.1", "train.steps=8", "train.checkpoint_every=3")
    trainer.train(cfg, tmp_path / "reference")
    fail_at_step(monkeypatch, cfg, tmp_path / "run", 5)
    summary = trainer.train(cfg, tmp_path / "run")
    assert summary["resumed_from"] == [3]
    assert_same_files(tmp_path / "run", tmp_path / "reference")
    # The clip fired: the logits start above tau and end far closer to it.
    logits = pd.read_csv(tmp_path / "run" / "layers.csv").groupby("step").max_attn_logit.max()
    assert logits[0] > 2.0 and logits[8] < logits[0]
