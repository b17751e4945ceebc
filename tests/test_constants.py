"""DeepNorm alpha / beta against the checks in REFERENCE.md Sec. 2, and on a built model."""

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
    assert {res.alpha for *_, res in model.residuals()} == {1.0}
