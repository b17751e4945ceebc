"""The loss a training step differentiates: the task's, the terms the trainer adds to it, and
its share on each of K processes."""

from __future__ import annotations

from typing import Optional

import torch

from stabexp import distributed
from stabexp.probes.statistics import log_z, token_mean


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


def training_loss(forward, task, batch, z_coefficient: float = 0.0, world: int = 1) -> torch.Tensor:
    """The loss of one batch through `forward` (the training model), z-loss included. On K
    processes, this rank's part of it: its rows' summed token loss (and z-loss) over the whole
    batch's count of predicted tokens, so that the ranks' parts add up to the mean."""
    if world == 1:
        src, tgt_in, tgt_out = batch
        logits = forward(src, tgt_in)
        loss = task.loss(logits, tgt_out)
        if z_coefficient > 0:
            loss = loss + z_coefficient * z_loss(logits, task.predicted(tgt_out))
        return loss
    count = task.predicted(batch[2]).sum().clamp(min=1)
    (src, tgt_in, tgt_out), weight = distributed.share(batch)
    logits = forward(src, tgt_in)
    loss = task.loss_sum(logits, tgt_out) / count
    if z_coefficient > 0:
        loss = loss + z_coefficient * z_loss(logits, task.predicted(tgt_out), count=count)
    return loss * weight
