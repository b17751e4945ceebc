"""The divergence check: a run whose training loss is not finite, or above train.explode_factor
times the larger of the chance loss and the first loss, ends there as "diverged" (docs/methods.md,
docs/outputs.md). The first loss can sit far above chance (tied embeddings, a strong identity
path), hence the larger of the two.

The losses are read by the host at the steps Cadence.must_sync names: every step on a CPU,
where a read costs nothing; on a GPU, which would stall behind its queue at each read, only at
the steps that sync anyway, the losses of the steps between kept on device until then. Read
late or at once, the record is the same: the first loss over the threshold ends the run at its
step, that step not applied, and the steps after it, taken before the read, void.

A StepHook (train/hooks.py), on in every run: after the backward it keeps the loss and reads
at a sync step, and when the process is asked to stop, or the loop ends, it reads what is left.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Dict, List, Tuple

import torch

from stabexp import distributed
from stabexp.train.hooks import StepHook

log = logging.getLogger("stabexp")


class DivergenceCheck(StepHook):
    @classmethod
    def enabled(cls, cfg) -> bool:
        return True

    @classmethod
    def from_config(cls, model, cfg) -> "DivergenceCheck":
        return cls(cfg.train.explode_factor)

    def __init__(self, explode_factor: float):
        self.explode_factor = explode_factor
        # Set by the first loss read (a resumed run's from its checkpoint); never, if that one is not finite.
        self.explode_at = float("inf")
        self.pending: List[Tuple[int, float, torch.Tensor]] = []  # (step, lr, loss) not read yet

    def after_backward(self, run, step: int, loss: torch.Tensor) -> bool:
        self.pending.append((step, run.sched.get_last_lr()[0], loss.detach()))
        return run.cadence.must_sync(step) and self.diverged(run)

    def on_stop_request(self, run) -> bool:
        return self.diverged(run)  # a run that diverged before the request ends as diverged

    def at_end(self, run) -> None:
        self.diverged(run)

    def state_dict(self) -> Dict:
        return {"explode_at": self.explode_at}

    def load_state_dict(self, state: Dict) -> None:
        self.explode_at = state["explode_at"]

    def diverged(self, run) -> bool:
        """Read the losses of the steps since the last read (one host sync) and check them in
        order: the first that is not finite or above the explosion threshold ends the run, with
        its row; that step is not applied (steps after it, taken before the read, are void)."""
        if not self.pending:
            return False
        steps, lrs, losses = zip(*self.pending)
        self.pending = []
        result = run.result
        # K ranks: each holds its part of every step's loss; their sum (one collective) is the
        # batch's loss, the same on every rank, so all of them stop at the same step.
        for step, lr, loss_value in zip(steps, lrs, distributed.sum_(torch.stack(losses)).float().tolist()):
            if result["first_loss"] is None:
                result["first_loss"] = loss_value
                if math.isfinite(loss_value):
                    self.explode_at = self.explode_factor * max(run.task.chance_loss, loss_value)
            result["last_loss"] = loss_value
            if not math.isfinite(loss_value) or loss_value > self.explode_at:
                result.update(status="diverged", diverged_at_step=step)
                run.steps_done = step - 1
                run.recorder.metrics.write([{"step": step, "lr": lr, "loss": loss_value,
                                             "elapsed_s": time.perf_counter() - run.start}])
                log.warning("diverged at step %d (loss %s)", step, loss_value)
                return True
        return False
