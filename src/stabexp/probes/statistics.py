"""The reductions the probes (and z-loss, train/losses.py) share: one definition each."""

from __future__ import annotations

from typing import Optional

import torch

from stabexp.model.transformer import attention_logits


def token_mean(values: torch.Tensor, tokens: Optional[torch.Tensor], dims=None) -> torch.Tensor:
    """Mean of per-token values (B, T) over the real tokens (`tokens`, bool (B, T)), or over
    every position when there is no padding (tokens None). `dims`: the token dimensions where
    `values` holds several such sets (n, B, T), one mean each. No host sync."""
    return values.mean(dims) if tokens is None else (values * tokens).sum(dims) / tokens.sum()


def per_token_norm(features: torch.Tensor, tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """sqrt(mean over the (real) tokens of ||features_token||_2^2): the model update's norm, and
    ||F(x, theta_0)|| that DeepNet's bound compares it with (probes/update_bound.py)."""
    return token_mean(features.pow(2).sum(-1), tokens).sqrt()


def log_z(logits: torch.Tensor) -> torch.Tensor:
    """log Z = logsumexp_j y_j over the vocabulary, per position (in fp32): the output logits'
    normaliser, which z-loss pulls to 0 and the log Z probes follow (Wortsman et al. 2023,
    Sec. 3.1.2)."""
    return torch.logsumexp(logits.float(), dim=-1)


def max_attention_logit(q: torch.Tensor, k: torch.Tensor, causal: bool,
                        key_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """The largest attention logit q_i.k_j / sqrt(d_h) over batch, heads and the (query, key)
    pairs the attention may use (Wortsman et al. 2023, Sec. 3.1.1: attention logit growth).
    q: (B, h, T, d_h), k: (B, h, S, d_h); key_mask (B, 1, 1, S) True where a key is real;
    `scale`: the model's own factor in place of 1 / sqrt(d_h)."""
    return attention_logits(q, k, causal, key_mask, scale).amax()
