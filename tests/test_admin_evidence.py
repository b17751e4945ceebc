"""Admin's chain of evidence (Liu et al. 2020): a placement per stack (the hybrids), the gradient
of each sublayer's output at init, the residual-dependency decomposition, Admin folded into
Post-LN and `stabexp export`, RAdam and the linear-decay schedule of the no-warm-up grid."""

import pytest
import torch
import torch.nn as nn

from stabexp.model import build_model, initialise
from stabexp.model.fold import admin_to_postln
from stabexp.model.placements import Admin, PostLN, PreLN
from stabexp.probes.at_init import grad_at_init
from stabexp.probes.dependency import BIAS, decompose, dependency
from stabexp.train.schedule import lr_factor


def _model(make_cfg, *overrides, vocab=12, trained=False):
    cfg = make_cfg(*overrides)
    torch.manual_seed(0)
    model = build_model(cfg, vocab)
    src, tgt = torch.randint(1, vocab, (3, 7)), torch.randint(1, vocab, (3, 6))
    initialise(model, cfg.group.init, lambda: (src, tgt, tgt))
    if trained:  # away from init: omegas off their profiled values, norm gains and biases off 1 and 0
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
    return model.eval(), src, tgt


def test_a_hybrid_has_each_stacks_own_placement_and_ends(make_cfg):
    model, *_ = _model(make_cfg, "group=hybrid_postln_preln")
    kinds = {stack: {type(res) for s, _, _, res in model.residuals() if s == stack} for stack in ("encoder", "decoder")}
    assert kinds == {"encoder": {PostLN}, "decoder": {PreLN}}
    assert isinstance(model.encoder_final_ln, nn.Identity) and isinstance(model.decoder_final_ln, nn.LayerNorm)
    reverse, *_ = _model(make_cfg, "group=hybrid_preln_postln")
    assert isinstance(reverse.encoder_final_ln, nn.LayerNorm) and isinstance(reverse.decoder_final_ln, nn.Identity)
    constants = initialise(reverse, "xavier", None)
    assert constants["residual"] == {"encoder": "preln", "decoder": "postln"}
    # DeepNorm's alpha belongs to the stack that is DeepNorm, not to the other.
    mixed, *_ = _model(make_cfg, "group=deepnorm", "group.decoder_residual=preln")
    assert mixed.config.encoder_alpha > 1 and mixed.config.decoder_alpha == 1.0


def test_output_gradient_is_the_gradient_of_the_sublayer_output(make_cfg):
    model, src, tgt = _model(make_cfg, "group=postln")
    model.train()
    result = grad_at_init(model, (src, tgt, tgt))
    assert len(result["output_grad_norm"]) == len(list(model.residuals()))
    # The top decoder sublayer's output is F (Post-LN has no final norm): its gradient is dL/dF.
    feats = model.features(src, tgt)
    feats.retain_grad()
    loss = nn.functional.cross_entropy(model.logits(feats).flatten(0, 1), tgt.flatten())
    loss.backward()
    assert result["output_grad_norm"][-1] == pytest.approx(feats.grad.norm().item(), rel=1e-5)
    assert all(g > 0 for g in result["output_grad_norm"])


@pytest.mark.parametrize("overrides", [
    ["group=postln"], ["group=preln"], ["group=admin"], ["group=deepnorm"], ["group=rezero_postln"],
    ["group=sandwich"], ["group=hybrid_postln_preln"], ["group=admin", "model.norm=rmsnorm"],
    ["group=postln", "model.arch=decoder_only", "task=lm"],
])
def test_the_decomposition_sums_back_to_every_sublayer_output(make_cfg, overrides):
    model, src, tgt = _model(make_cfg, *overrides, trained=True)
    entries = decompose(model, src, tgt)
    assert len(entries) == len(list(model.residuals()))
    for entry in entries:
        parts = entry["parts"]
        assert set(parts) - {BIAS} == set(range(entry["index"] + 1))  # the embedding and branches 1..i
        torch.testing.assert_close(sum(parts.values()), entry["output"], atol=2e-5, rtol=1e-5)


def test_pre_ln_dependency_is_each_branchs_share_of_the_stream(make_cfg):
    # Pre-LN adds each branch to the stream unchanged: beta_ij = spread(a_j) / spread(x_i).
    model, src, tgt = _model(make_cfg, "group=preln", "model.arch=decoder_only", "task=lm")
    outputs, inputs = [], []

    def keep(module, args, y):
        inputs.append(args[0])
        outputs.append(y)

    hooks = [res.register_forward_hook(keep) for *_, res in model.residuals()]
    with torch.no_grad():
        model.features(src, tgt)
    for h in hooks:
        h.remove()

    def spread(t):
        return t.var(-1, unbiased=False).mean().sqrt().item()

    rows = {(r["sublayer"], r["component"]): r["beta"] for r in dependency(model, src, tgt)}
    branches = [inputs[0]] + [y - x for x, y in zip(inputs, outputs)]
    for i, y in enumerate(outputs, start=1):
        for j in range(i + 1):
            assert rows[(i, j)] == pytest.approx(spread(branches[j]) / spread(y), rel=1e-4)
        assert sum(rows[(i, j)] ** 2 for j in range(i + 1)) == pytest.approx(1, abs=0.5)


@pytest.mark.parametrize("overrides", [[], ["model.norm=rmsnorm"], ["model.arch=decoder_only", "task=lm"]])
def test_admin_folds_into_post_ln_with_equal_outputs(make_cfg, overrides):
    model, src, tgt = _model(make_cfg, "group=admin", *overrides, trained=True)
    folded = admin_to_postln(model).eval()
    assert folded.config.residual == "postln" and not any(isinstance(r, Admin) for *_, r in folded.residuals())
    # The tied embedding keeps each stack's first omega as its input scale.
    assert folded.input_scale is not None
    with torch.no_grad():
        torch.testing.assert_close(folded(src, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_an_untrained_admin_model_folds_into_a_plain_post_ln(make_cfg):
    model, src, tgt = _model(make_cfg, "group=admin")  # profiling starts each stack at omega = 1
    folded = admin_to_postln(model).eval()
    assert folded.input_scale is None
    with torch.no_grad():
        torch.testing.assert_close(folded(src, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)
    postln, *_ = _model(make_cfg, "group=postln")
    with pytest.raises(ValueError, match="Admin"):
        admin_to_postln(postln)


def test_a_run_keeps_its_dependency_and_weights_and_exports_them(tmp_path, make_cfg, stabexp_main):
    from stabexp.export import load_exported, load_run_model
    from stabexp.train.trainer import train

    cfg = make_cfg("group=admin", "probe.dependency=true", "train.save_model=true")
    out = tmp_path / "run"
    train(cfg, out)
    import pandas as pd

    dep = pd.read_csv(out / "dependency.csv")
    assert list(dep.columns) == ["step", "stack", "sublayer", "component", "beta"]
    assert set(dep.step) == {0, cfg.train.steps} and set(dep["stack"]) == {"encoder", "decoder"}
    own = dep[dep.component == dep.sublayer]
    assert own.beta.between(0, 1.5).all() and len(own) == 2 * 2 * (2 + 3)
    r = stabexp_main("export", str(out))
    assert r.returncode == 0, r.stderr
    admin, folded = load_run_model(out), load_exported(out / "postln_model.pt")
    src = torch.randint(1, 10, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(folded(src, src), admin(src, src), atol=1e-5, rtol=1e-5)


def test_export_refuses_what_it_cannot_fold(tmp_path, make_cfg, stabexp_main):
    from stabexp.train.trainer import train

    r = stabexp_main("export", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not a run folder" in r.stderr
    train(make_cfg("group=postln", "train.save_model=true"), tmp_path / "postln")
    r = stabexp_main("export", str(tmp_path / "postln"))
    assert r.returncode == 2 and "group.residual=postln" in r.stderr
    train(make_cfg("group=admin"), tmp_path / "admin")
    r = stabexp_main("export", str(tmp_path / "admin"))
    assert r.returncode == 2 and "train.save_model=true" in r.stderr


def test_warmup_then_linear_decay_reaches_zero_after_the_last_step():
    factors = [lr_factor("warmup_linear_decay", t, 1, total_steps=4) for t in range(1, 6)]
    assert factors == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert lr_factor("warmup_linear_decay", 2, 4, total_steps=10) == 0.5


def test_radam_is_torchs(make_cfg):
    from stabexp.train.optim import build_optimizer

    cfg = make_cfg("optim=radam", "optim.betas=[0.9,0.995]")
    opt = build_optimizer(cfg, nn.Linear(2, 2), torch.device("cpu"))
    assert isinstance(opt, torch.optim.RAdam) and opt.param_groups[0]["betas"] == (0.9, 0.995)
