"""What acts on a run from outside the loop, at named moments, as OLMo-core's callbacks do:
the divergence check (train/divergence.py) reads the losses after the backward and ends a run
whose loss exploded; QK-Clip (train/qk_clip.py) keeps each head's largest logit around the
forward and rescales W_q, W_k after the optimiser step; the checkpoints (train/checkpoint.py)
are written after a step and when the process is asked to stop. The probes, which observe
rather than act, have moments of their own (stabexp.probes.ProbeSet).

Moments inside a step are called by `Run.step` (train/run.py), those between steps by the loop
(`steps` in train/trainer.py, through the Run). A hook acts at the moments it overrides, and a
run calls at each moment only the hooks that act there (`by_moment`): a run with no hook pays
for none, and a moment no hook acts at costs nothing.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Dict, List, Sequence


class StepHook:
    """One thing that acts on the run; Run builds those whose `enabled(cfg)` is true (STEP_HOOKS
    in train/run.py, in the order they are called at each moment), and a config is checked
    against each of them before the run starts."""

    @classmethod
    def enabled(cls, cfg) -> bool:
        """Whether the config turns this hook on."""
        return False

    @classmethod
    def check(cls, cfg) -> None:
        """What the hook needs of the rest of the config, once it is on (ConfigError)."""

    @classmethod
    def from_config(cls, model, cfg) -> "StepHook":
        raise NotImplementedError

    # --- inside a step (Run.step) ---------------------------------------------------------------

    def around_forward(self, run):
        """A context manager around the step's training forward, loss and backward; with
        train.update_freq > 1, around those of every batch of the step."""
        return nullcontext()

    def after_backward(self, run, step: int, loss) -> bool:
        """After the backward of step `step`, its gradients in place and not used yet; `loss`
        is its loss on device (on K ranks, this rank's part of it). True ends the run there:
        the step is not applied, and the hooks after this one are not called."""
        return False

    def after_optimizer_step(self, run) -> None:
        """After the optimiser step, before the lr schedule's."""

    # --- between steps (trainer.steps, through the Run) -----------------------------------------

    def after_step(self, run, step: int) -> None:
        """After step `step` is whole (applied and recorded), when the ranks have agreed that
        no one asked to stop (a request is `on_stop_request`'s instead)."""

    def on_stop_request(self, run) -> bool:
        """The process was asked to stop after the step just taken. True ends the run there
        (it diverged: no checkpoint, no stop), and the hooks after this one are not called."""
        return False

    def at_end(self, run) -> None:
        """After the last step the loop takes (the run's last, or the one it diverged at)."""

    # --- in a checkpoint ------------------------------------------------------------------------

    def state_dict(self) -> Dict:
        """What a resumed run needs of this hook: entries of the checkpoint's own dict
        (Run.checkpoint_state), under keys of the hook's."""
        return {}

    def load_state_dict(self, state: Dict) -> None:
        """From the checkpoint's dict, as `state_dict` wrote it."""


MOMENTS = ("around_forward", "after_backward", "after_optimizer_step",  # in Run.step
           "after_step", "on_stop_request", "at_end")  # between steps


def by_moment(hooks: Sequence[StepHook]) -> Dict[str, List[StepHook]]:
    """Each moment -> the hooks (in order) that act at it: those that override it."""
    return {moment: [h for h in hooks if getattr(type(h), moment) is not getattr(StepHook, moment)]
            for moment in MOMENTS}
