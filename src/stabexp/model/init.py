"""Named initialisation rules and the constants they use. REFERENCE.md Sec. 2.

Each rule takes a freshly built Seq2SeqTransformer and a callable giving one training batch
(only Admin's profiling needs it) and returns the constants it resolved, for summary.json.
A new rule is one function here plus its entry in INIT_RULES.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

import torch
import torch.nn as nn

from stabexp.model.transformer import Residual, Seq2SeqTransformer

Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


# --- DeepNorm constants (Wang et al. 2022, arXiv 2203.00555, Table in Sec. 2.3 / Fig. 2) ----

def deepnorm_single_stack(n_layers: int) -> Dict[str, float]:
    """Encoder-only or decoder-only DeepNet: alpha = (2N)^(1/4), beta = (8N)^(-1/4)."""
    return {"alpha": (2 * n_layers) ** 0.25, "beta": (8 * n_layers) ** -0.25}


def deepnorm_encoder_decoder(n_enc: int, n_dec: int) -> Dict[str, Dict[str, float]]:
    """Encoder-decoder DeepNet, following the paper (not torchscale 0.3.0, whose encoder beta is
    1.15 (N^4 M)^(-1/16) instead of the paper's 0.87 (N^4 M)^(-1/16); Transformer-Clinic
    agrees with the paper)."""
    nm = n_enc ** 4 * n_dec
    return {
        "encoder": {"alpha": 0.81 * nm ** (1 / 16), "beta": 0.87 * nm ** (-1 / 16)},
        "decoder": {"alpha": (3 * n_dec) ** 0.25, "beta": (12 * n_dec) ** -0.25},
    }


# --- rules -------------------------------------------------------------------------------

def _stack_depth(model: Seq2SeqTransformer, stack: str) -> int:
    return len(model.encoder) if stack == "encoder" else len(model.decoder)


@torch.no_grad()
def xavier(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """Every projection W ~ N(0, 1/d') with d' = (fan_in + fan_out)/2 (xavier_normal, gain 1),
    each of W_Q, W_K, W_V taken as its own d x d matrix; biases 0; LN weight 1, bias 0;
    embeddings N(0, d^-1/2) as in fairseq (they are scaled by sqrt(d) on input)."""
    nn.init.normal_(model.embed.weight, 0.0, model.config.d_model ** -0.5)
    for *_, res in model.residuals():
        for w in res.branch.matrices().values():
            nn.init.xavier_normal_(w)
        for m in res.branch.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        if isinstance(m, Residual) and hasattr(m, "omega"):
            nn.init.ones_(m.omega)
    return {}


@torch.no_grad()
def postln_init(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """DeepNet Sec. 3 "Post-LN-init": Xavier, then every weight matrix of layer l (1-based from
    the bottom of its stack of L layers) divided by k_l = L + 1 - l, i.e.
    W ~ N(0, 1/(k_l^2 d')). The bottom layer shrinks most, the top layer is unchanged. The paper
    shows the FFN output projection; scaling every matrix of the layer is our reading."""
    xavier(model)
    for stack, layer, _, res in model.residuals():
        k = _stack_depth(model, stack) + 1 - layer
        for w in res.branch.matrices().values():
            w.div_(k)
    return {"postln_init": {"k_bottom": {"encoder": len(model.encoder), "decoder": len(model.decoder)}}}


# The matrices DeepNorm scales by beta: V and O of every attention, W_1 and W_2 of the FFN.
DEEPNORM_SCALED = ("v", "o", "w1", "w2")


@torch.no_grad()
def deepnorm(model: Seq2SeqTransformer, batch: Callable[[], Batch] = None) -> Dict:
    """DeepNet Sec. 2.3: xavier_normal with gain beta for W_V, W_O, W_1, W_2 (the decoder's
    cross-attention V and O too), gain 1 for W_Q, W_K; beta per stack from the enc-dec table."""
    xavier(model)
    constants = deepnorm_encoder_decoder(len(model.encoder), len(model.decoder))
    for stack, _, _, res in model.residuals():
        for name, w in res.branch.matrices().items():
            if name in DEEPNORM_SCALED:
                nn.init.xavier_normal_(w, gain=constants[stack]["beta"])
    return {"deepnorm": constants}


class AdminProfile:
    """Transformer-Clinic's profiling walk over one stack's residual sublayers, bottom-up:
    before sublayer i, omega_i <- ratio; then ratio <- sqrt(Var(omega_i x_i) + Var(G_i(x_i))),
    starting at ratio = 1. Var is over the whole flattened tensor (population variance, as
    numpy's var in Clinic). Residual.forward calls `step` while the profile is attached."""

    def __init__(self, tokens=None):
        self.ratio = 1.0
        self.omegas = []
        self.tokens = tokens  # (B, T) real tokens of the stack's input; None: every position

    def step(self, res: Residual, x: torch.Tensor, g: torch.Tensor) -> None:
        res.omega.fill_(self.ratio)
        self.omegas.append(self.ratio)
        x = res.omega * x
        if self.tokens is not None:  # padding is not part of the signal being profiled
            x, g = x[self.tokens], g[self.tokens]
        var_x = torch.var(x, unbiased=False)
        var_g = torch.var(g, unbiased=False)
        self.ratio = math.sqrt(float(var_x) + float(var_g))


@torch.no_grad()
def admin_profiled(model: Seq2SeqTransformer, batch: Callable[[], Batch]) -> Dict:
    """Admin (Liu et al. 2020, Sec. 4.2, Transformer-Clinic): Xavier init, then one forward pass
    on one training batch in training mode, setting each omega (a per-dimension vector filled
    with the profiled scalar) bottom-up in each stack."""
    xavier(model)
    src, tgt_in, _ = batch()
    profiles = {stack: AdminProfile(tokens) for stack, tokens in model.token_masks(src, tgt_in).items()}
    for stack, _, _, res in model.residuals():
        res.admin_profile = profiles[stack]
    was_training = model.training
    model.train()
    try:
        model(src, tgt_in)
    finally:
        for *_, res in model.residuals():
            res.admin_profile = None
        model.train(was_training)
    return {"admin_omega": {stack: p.omegas for stack, p in profiles.items()}}


INIT_RULES: Dict[str, Callable[..., Dict]] = {
    "xavier": xavier,
    "postln_init": postln_init,
    "deepnorm": deepnorm,
    "admin_profiled": admin_profiled,
}
