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


def training_loss(forward, task, batch, z_coefficient: float = 0.0, world: int = 1,
                  count: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The loss of one batch through `forward` (the training model), z-loss included. On K
    processes, this rank's part of it: its rows' summed token loss (and z-loss) over the whole
    batch's count of predicted tokens, so that the ranks' parts add up to the mean. `count`:
    over that count instead, the predicted tokens of every batch of an optimiser step
    (`update_count`, train.update_freq > 1), so that the batches' parts add up to the step's
    mean as fairseq's --update-freq sums them."""
    if world == 1 and count is None:
        src, tgt_in, tgt_out = batch
        logits = forward(src, tgt_in)
        loss = task.loss(logits, tgt_out)
        if z_coefficient > 0:
            loss = loss + z_coefficient * z_loss(logits, task.predicted(tgt_out))
        return loss
    if count is None:
        count = update_count(task, [batch])
    (src, tgt_in, tgt_out), weight = distributed.share(batch) if world > 1 else (batch, 1.0)
    logits = forward(src, tgt_in)
    loss = task.loss_sum(logits, tgt_out) / count
    if z_coefficient > 0:
        loss = loss + z_coefficient * z_loss(logits, task.predicted(tgt_out), count=count)
    return loss * weight


def update_count(task, batches) -> torch.Tensor:
    """The predicted tokens of the batches of one optimiser step, whole (every rank's rows): the
    divisor of each batch's summed loss (at least 1)."""
    return sum(task.predicted(batch[2]).sum() for batch in batches).clamp(min=1)
