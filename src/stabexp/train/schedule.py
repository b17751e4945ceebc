"""Learning-rate schedules, as a multiplier of the peak lr for optimiser step t (1-based)."""

from __future__ import annotations

import math
from typing import Callable, Optional


def lr_factor(schedule: str, step: int, warmup_steps: int, init_factor: Optional[float] = None,
              decay_period: int = 4000, total_steps: int = 0) -> float:
    """`init_factor`: fairseq's --warmup-init-lr as a fraction of the peak lr, or None;
    `total_steps`: the run's length, where warmup_linear_decay reaches 0."""
    if schedule == "constant":
        # DeepNet's "Post-LN without warm-up": the peak lr from the first step.
        return 1.0
    if schedule == "warmup_inverse_sqrt":
        if init_factor is not None:
            # fairseq's inverse_square_root_schedule.py, update for update: the scheduler sets
            # warmup_init_lr before the first update and is stepped after each one, so update t
            # runs at n = t - 1 completed updates: init + n (peak - init) / warmup_steps while
            # n < warmup_steps, then peak sqrt(warmup_steps / n). DeepNet's Table 4 recipe
            # (warm-up from 1e-7) is this form.
            n = step - 1
            if n < warmup_steps:
                return init_factor + n * (1.0 - init_factor) / warmup_steps
            return math.sqrt(warmup_steps / n)
        # Without a start lr: linear warm-up to the peak over warmup_steps, reached at step
        # warmup_steps, then decay as sqrt(warmup_steps / t) (Vaswani et al. 2017 Sec. 5.3).
        if warmup_steps <= 0:
            return 1.0 / math.sqrt(step)
        if step <= warmup_steps:
            return step / warmup_steps
        return math.sqrt(warmup_steps / step)
    if schedule == "inverse_sqrt_nowarmup":
        # T-Fixup's schedule (layer6ai-labs/T-Fixup, --lr-scheduler inverse_sqrt_nowarmup):
        # lr0 sqrt(D / (D + n)) with n = t - 1 completed updates, no warm-up.
        return math.sqrt(decay_period / (decay_period + step - 1))
    if schedule == "warmup_linear_decay":
        # fairseq's polynomial_decay with power 1, as Admin's no-warm-up grid runs it
        # (Transformer-Clinic iwslt14_de-en.md: --warmup-updates 1, decay to 0 at the last
        # update): linear warm-up to the peak at step warmup_steps, then a straight line to 0
        # after step total_steps.
        if step <= warmup_steps:
            return step / warmup_steps
        return max(0.0, (total_steps + 1 - step) / (total_steps + 1 - warmup_steps))
    raise ValueError(f"unknown schedule {schedule!r}")


def factor_of(cfg) -> Callable[[int], float]:
    """The multiplier of the peak lr at optimiser step t (1-based) that a run's config asks for:
    its group's schedule where train.schedule is "group", fairseq's warm-up start as a fraction
    of the peak."""
    t = cfg.train
    schedule = cfg.group.schedule if t.schedule == "group" else t.schedule
    init_factor = None if t.warmup_init_lr is None else t.warmup_init_lr / t.lr
    return lambda step: lr_factor(schedule, step, t.warmup_steps, init_factor, t.decay_period, t.steps)
