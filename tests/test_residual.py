"""Residual.forward of every style against its paper's formula (docs/methods.md, "Residual
placements"), with a stub branch of known output,
and the final LN that Pre-LN puts on top of each stack."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from stabexp.model import build_model
from stabexp.model.placements import PLACEMENTS
from stabexp.model_options import TransformerConfig

D = 8


G = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(1))


class Stub(nn.Module):
    """A branch of known output G whatever its input (not a multiple of x, which an LN would
    hide), recording what it was given."""

    def forward(self, x):
        self.seen = x
        return G


def _ln(x):
    return F.layer_norm(x, (D,))


def residual(style, alpha=1.0, branch=None):
    """The residual piece of `style` around a stub branch, as a layer would build it."""
    c = TransformerConfig(vocab_size=4, d_model=D, residual=style, encoder_alpha=alpha)
    return PLACEMENTS[style].residual(branch or Stub(), c, "encoder", {})


@pytest.fixture
def x():
    return torch.randn(3, 5, D, generator=torch.Generator().manual_seed(0)) * 3 + 1


@pytest.mark.parametrize("style, expected", [
    ("postln", lambda x, a, w: _ln(x + G)),          # Vaswani et al. 2017
    ("preln", lambda x, a, w: x + G),                # Xiong et al. 2020 (the branch sees LN(x))
    ("deepnorm", lambda x, a, w: _ln(a * x + G)),    # DeepNet Sec. 2.3
    ("admin", lambda x, a, w: _ln(w * x + G)),       # Admin eq. 7
    ("rezero", lambda x, a, w: x + 0.7 * G),         # ReZero, its alpha set to 0.7 below
    ("rezero_postln", lambda x, a, w: _ln(x + 0.7 * G)),
    ("fixup", lambda x, a, w: x + 1.5 * G),          # Fixup, scale 1.5 (its shift 0.25 is on the input)
    ("plain", lambda x, a, w: x + G),                # T-Fixup
    ("sandwich", lambda x, a, w: x + _ln(G)),        # Sandwich-LN (the branch sees LN(x))
])
def test_each_style_combines_x_and_its_branch_as_the_paper_writes(x, style, expected):
    alpha = 2.5
    res = residual(style, alpha)
    omega = torch.linspace(0.5, 4.0, D)
    with torch.no_grad():
        if style == "admin":
            res.omega.copy_(omega)
        if style.startswith("rezero"):
            res.alpha.fill_(0.7)
        if style == "fixup":
            res.scale.weight.fill_(1.5)
            res.shift.bias.fill_(0.25)
    out = res(x)
    torch.testing.assert_close(out, expected(x, alpha, omega), rtol=1e-5, atol=1e-5)
    # What the branch saw: the normalised input for Pre-LN and Sandwich, the shifted input for
    # Fixup, the raw input for the others.
    seen = {"preln": _ln(x), "sandwich": _ln(x), "fixup": x + 0.25}.get(style, x)
    torch.testing.assert_close(res.branch.seen, seen)


def test_the_residual_scale_is_used_not_just_stored(x):
    plain = residual("deepnorm", alpha=1.0)(x)
    scaled = residual("deepnorm", alpha=3.0)(x)
    assert not torch.allclose(plain, scaled, atol=1e-3)


@pytest.mark.parametrize("group, final_ln", [
    ("preln", True), ("sandwich", True), ("normformer", True), ("subln", True), ("dlcl", True),
    ("postln", False), ("deepnorm", False), ("admin", False), ("ds_init", False), ("rezero_postln", False)])
def test_only_pre_ln_like_groups_put_an_ln_on_top_of_each_stack(make_cfg, group, final_ln):
    cfg = make_cfg(f"group={group}", "depth=2")
    model = build_model(cfg, cfg.task.vocab_size)
    with torch.no_grad():  # make the top LNs visible: a gain and a shift that no stream has
        for ln in (model.encoder_final_ln, model.decoder_final_ln):
            if isinstance(ln, nn.LayerNorm):
                ln.weight.fill_(3.0)
                ln.bias.fill_(-2.0)
    src = torch.randint(1, cfg.task.vocab_size, (2, 5))
    tgt = torch.randint(1, cfg.task.vocab_size, (2, 4))
    for out in (model.encode(src), model.features(src, tgt)):
        mean, std = out.mean(-1), out.std(-1, unbiased=False)
        if final_ln:  # gain 3, shift -2 on a normalised vector
            torch.testing.assert_close(mean, torch.full_like(mean, -2.0), rtol=0, atol=1e-4)
            torch.testing.assert_close(std, torch.full_like(std, 3.0), rtol=1e-3, atol=1e-3)
        else:  # the last sublayer's own LN (gain 1, shift 0) is the top
            torch.testing.assert_close(mean, torch.zeros_like(mean), rtol=0, atol=1e-4)
            torch.testing.assert_close(std, torch.ones_like(std), rtol=1e-3, atol=1e-3)
