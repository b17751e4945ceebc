"""DeepNorm alpha / beta (DeepNet, arXiv 2203.00555, Fig. 2) against worked values, and on a
built model (docs/methods.md, "DeepNorm constants")."""

import pytest

from stabexp.model import build_model
from stabexp.model.init import deepnorm_encoder_decoder, deepnorm_single_stack


def test_single_stack_n6():
    c = deepnorm_single_stack(6)
    assert c["alpha"] == pytest.approx(1.8612, abs=1e-4)
    assert c["beta"] == pytest.approx(0.3799, abs=1e-4)


def test_encoder_decoder_6l_6l():
    c = deepnorm_encoder_decoder(6, 6)
    assert c["encoder"]["alpha"] == pytest.approx(1.4179, abs=1e-4)
    assert c["decoder"]["alpha"] == pytest.approx(2.0598, abs=1e-4)


def test_encoder_decoder_18l_18l():
    c = deepnorm_encoder_decoder(18, 18)
    assert c["encoder"]["alpha"] == pytest.approx(1.9987, abs=1e-4)
    assert c["encoder"]["beta"] == pytest.approx(0.3526, abs=1e-4)
    assert c["decoder"]["alpha"] == pytest.approx(2.7108, abs=1e-4)
    assert c["decoder"]["beta"] == pytest.approx(0.2608, abs=1e-4)


def test_encoder_decoder_6l_18l_worked_out_from_the_formulas():
    """N = 6, M = 18: encoder alpha 0.81 (N^4 M)^(1/16), beta 0.87 (N^4 M)^(-1/16); decoder
    alpha (3M)^(1/4), beta (12M)^(-1/4). Swapping N and M changes every encoder value."""
    c = deepnorm_encoder_decoder(6, 18)
    assert c["encoder"]["alpha"] == pytest.approx(1.5187, abs=1e-4)
    assert c["encoder"]["beta"] == pytest.approx(0.4640, abs=1e-4)
    assert c["decoder"]["alpha"] == pytest.approx(2.7108, abs=1e-4)
    assert c["decoder"]["beta"] == pytest.approx(0.2608, abs=1e-4)


def test_model_uses_alpha_per_stack(make_cfg):
    cfg = make_cfg("group=deepnorm", "depth=18")
    model = build_model(cfg, cfg.task.vocab_size)
    alphas = {"encoder": set(), "decoder": set()}
    for stack, _, _, res in model.residuals():
        alphas[stack].add(res.alpha)
    assert len(alphas["encoder"]) == len(alphas["decoder"]) == 1
    assert alphas["encoder"].pop() == pytest.approx(1.9987, abs=1e-4)
    assert alphas["decoder"].pop() == pytest.approx(2.7108, abs=1e-4)


def test_other_styles_do_not_scale_the_residual(make_cfg):
    cfg = make_cfg("group=postln", "depth=3")
    model = build_model(cfg, cfg.task.vocab_size)
    assert not any(hasattr(res, "alpha") for *_, res in model.residuals())


@pytest.mark.parametrize("n, subln, t_fixup, fixup, torchscale_beta", [
    # Computed from the papers' formulas (rounded to 3 digits); docs/methods.md lists them.
    (6, (1.547, 1.700), (0.428, 0.369), (30, 0.567, 0.183), 0.657),
    (18, (2.183, 1.997), (0.325, 0.280), (90, 0.472, 0.105), 0.466),
    (100, (3.174, 2.388), (0.212, 0.183), (500, 0.355, 0.045), 0.273),
])
def test_table1_constants_at_the_papers_depths(n, subln, t_fixup, fixup, torchscale_beta):
    from stabexp.model.init import (deepnorm_torchscale_constants, fixup_constants, subln_encoder_decoder,
                                    t_fixup_constants)

    g = subln_encoder_decoder(n, n)
    assert (g["encoder"], g["decoder"]) == pytest.approx(subln, abs=1e-3)
    t = t_fixup_constants(n, n)
    assert (t["encoder"], t["decoder"]) == pytest.approx(t_fixup, abs=1e-3)
    f = fixup_constants(n, n)
    assert (f["L"], f["attn_in"], f["fc1"]) == pytest.approx(fixup, abs=1e-3)
    assert deepnorm_torchscale_constants(n, n)["encoder"]["beta"] == pytest.approx(torchscale_beta, abs=1e-3)
