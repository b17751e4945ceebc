"""The norms a placement can put on the residual stream or inside a branch (LayerNorm, RMSNorm,
DyT, by `make_norm`), and the small learnable pieces that some placements add: Fixup's scalar
shift and scale, NormFormer's HeadScale. The placements that use them: model/placements.py."""

from __future__ import annotations

import torch
import torch.nn as nn


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization", arXiv 2503.10622,
    Alg. 1; jiachenzhu/DyT dynamic_tanh.py): gamma * tanh(alpha x) + beta over the last
    dimension, alpha one learnable scalar (shape (1,)), gamma 1 and beta 0 at init. It takes the
    place of a norm and computes no statistic of x. alpha's initial value is set per site by
    `TokenModel._set_dyt_alphas`."""

    def __init__(self, dim: int, alpha: float = 0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias


NORM_TYPES = (nn.LayerNorm, nn.RMSNorm, DyT)


def make_norm(kind: str, dim: int) -> nn.Module:
    if kind == "rmsnorm":
        # RMSNorm (Zhang & Sennrich 2019): x / RMS(x) * g, no mean, no bias. eps 1e-6 inside the
        # sqrt (torchscale / LLaMA), not the paper code's 1e-8 added outside it.
        return nn.RMSNorm(dim, eps=1e-6)
    if kind == "dyt":
        return DyT(dim)
    return nn.LayerNorm(dim)


class Shift(nn.Module):
    """Fixup's scalar bias, x + b with b learnable, init 0 (Zhang et al. 2019, rule 3)."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class Scale(nn.Module):
    """Fixup's scalar multiplier, init 1 (Zhang et al. 2019, rule 3)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class HeadScale(nn.Module):
    """NormFormer's HeadScale: head h's d/H slice of (B, T, d) times a learnable gamma_h, init 1.
    Placed before W_O it scales the heads (the paper); after W_O it scales d/H-chunks of the
    projected output (fairseq's code). PLACEMENTS names both."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(n_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        h = self.gamma.shape[0]
        return (x.view(B, T, h, d // h) * self.gamma[:, None]).view(B, T, d)
