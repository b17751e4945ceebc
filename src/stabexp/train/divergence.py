"""The divergence check: a run whose training loss is not finite, or above train.explode_factor
times the larger of the chance loss and the first loss, ends there as "diverged" (docs/methods.md,
docs/outputs.md). The first loss can sit far above chance (tied embeddings, a strong identity
path), hence the larger of the two.

The Run reads the losses (Run.read_losses): every step on a CPU, where a read costs nothing; on
a GPU, which would stall behind its queue at each read, only at the steps that sync anyway
(Cadence.must_sync), the losses of the steps between kept on device until then, and when the
loop stops or ends. Read late or at once, the record is the same: the first loss over the
threshold ends the run at its step, that step not applied, and the steps after it, taken before
the read, void. This hook is the rule alone, a StepHook (train/hooks.py) on in every run.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

from stabexp.train.hooks import HookContext, Reading, StepHook


class DivergenceCheck(StepHook):
    name = "divergence"

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

    def losses_read(self, ctx: HookContext, readings: List[Reading]) -> Optional[int]:
        """The first step whose loss is not finite or above the explosion threshold, if any."""
        first = ctx.first_loss()  # the Run's, set at the first reading
        if math.isinf(self.explode_at) and first is not None and math.isfinite(first):
            self.explode_at = self.explode_factor * max(ctx.chance_loss, first)
        for step, _, loss in readings:
            if not math.isfinite(loss) or loss > self.explode_at:
                return step
        return None

    def state_dict(self) -> Dict:
        return {"explode_at": self.explode_at}

    def load_state_dict(self, state: Dict) -> None:
        self.explode_at = state["explode_at"]
