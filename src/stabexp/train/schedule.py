"""Learning-rate schedules, as a multiplier of the peak lr for optimiser step t (1-based)."""

from __future__ import annotations

import math


def lr_factor(schedule: str, step: int, warmup_steps: int) -> float:
    if schedule == "constant":
        # DeepNet's "Post-LN without warm-up": the peak lr from the first step.
        return 1.0
    if schedule == "warmup_inverse_sqrt":
        # fairseq's inverse_sqrt (Vaswani et al. 2017 Sec. 5.3): linear warm-up to the peak over
        # warmup_steps, then decay as sqrt(warmup_steps / t).
        if warmup_steps <= 0:
            return 1.0 / math.sqrt(step)
        if step <= warmup_steps:
            return step / warmup_steps
        return math.sqrt(warmup_steps / step)
    raise ValueError(f"unknown schedule {schedule!r}")
