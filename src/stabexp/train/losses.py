"""Terms the trainer adds to the task's loss."""

from __future__ import annotations

from typing import Optional

import torch

from stabexp.model.transformer import token_mean


def log_z(logits: torch.Tensor) -> torch.Tensor:
    """log Z = logsumexp_j y_j over the vocabulary, per position (in fp32): the output logits'
    normaliser, which z-loss pulls to 0 and the log Z probes follow (Wortsman et al. 2023,
    Sec. 3.1.2)."""
    return torch.logsumexp(logits.float(), dim=-1)


def z_loss(logits: torch.Tensor, predicted: Optional[torch.Tensor] = None,
           count: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The mean over predicted positions of (log Z)^2, log Z = logsumexp_j y_j over the
    vocabulary (PaLM, Chowdhery et al. 2022, Sec. 5; Wortsman et al. 2023, Sec. 3.1.2 with
    coefficient 1e-4; t5x losses.py). It pulls log Z to 0; its gradient on the logits of a
    position is 2 log Z softmax(y) / (predicted positions). logits (B, T, V); predicted (B, T)
    bool, None: every position. `count`: divide the sum over `predicted` by it instead (a
    share of a batch on K processes, over the whole batch's count)."""
    if count is not None:
        return (log_z(logits).pow(2) * predicted).sum() / count
    return token_mean(log_z(logits).pow(2), predicted)
