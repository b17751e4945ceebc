"""What acts on a run from outside the loop, at named moments, as OLMo-core's callbacks do:
the divergence check (train/divergence.py) reads each loss the host reads and ends a run whose
loss exploded; QK-Clip (train/qk_clip.py) keeps each head's largest logit around the forward and
rescales W_q, W_k after the optimiser step; the checkpoints (train/checkpoint.py) are written
after a step and when the process is asked to stop. The probes, which observe rather than act,
have moments of their own (stabexp.probes.ProbeSet).

A step hook is a plug-in as a probe is: the built-ins are registered by name
(train/builtin_hooks.py, the package's entry point of the group `stabexp.step_hooks`), each on
where its config turns it on; another package registers its own in that group, and
`train.hooks=[name or module.Class, ...]` turns them on after the built-ins (docs/plugins.md).

Moments inside a step are called by `Run.step` (train/run.py), those between steps by the loop
(`steps` in train/trainer.py, through the Run). A hook is given a `HookContext`, the run's
parts it may touch, never the Run itself; the Run keeps its own books (the losses, the step
count, the files). A hook acts at the moments it overrides, and a run calls at each moment only
the hooks that act there (`by_moment`): a run with no hook pays for none, and a moment no hook
acts at costs nothing.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn


@dataclass
class HookContext:
    """What a step hook is given of its run at every moment."""

    model: nn.Module                       # the eager model (its weights; the training forward may wrap it)
    optimizer: torch.optim.Optimizer
    cfg: Any                               # the run's resolved config
    chance_loss: float                     # the task's loss of a uniform guess
    first_loss: Callable[[], Optional[float]]  # the run's first loss the host has read (None: none yet)
    is_checkpoint_step: Callable[[int], bool]  # train.checkpoint_every's steps
    save_checkpoint: Callable[[], None]    # write the run's checkpoint now (at the end of the step just taken)


# (step, lr, loss): one step's training loss as the host read it, with the lr it was taken at.
Reading = Tuple[int, float, float]


class StepHook:
    """One thing that acts on the run; a run builds those `plugins.step_hooks(cfg)` turns on,
    in the order they are called at each moment, and a config is checked against each of them
    before the run starts."""

    name = ""  # the name it is registered under (set by the registry)

    @classmethod
    def enabled(cls, cfg) -> bool:
        """Whether the config turns this built-in hook on (one named in train.hooks is on)."""
        return False

    @classmethod
    def check(cls, cfg) -> None:
        """What the hook needs of the rest of the config, once it is on (ConfigError)."""

    @classmethod
    def from_config(cls, model, cfg) -> "StepHook":
        return cls()

    # --- inside a step (Run.step) ---------------------------------------------------------------

    def around_forward(self, ctx: HookContext):
        """A context manager around the step's training forward, loss and backward; with
        train.update_freq > 1, around those of every batch of the step."""
        return nullcontext()

    def losses_read(self, ctx: HookContext, readings: List[Reading]) -> Optional[int]:
        """The losses the host has just read, in step order (every step on a CPU; on a GPU at the
        steps that sync anyway, and when the loop stops or ends). A step returned ends the run
        there as diverged: that step is not applied, the steps after it are void, and the hooks
        after this one are not called."""
        return None

    def after_optimizer_step(self, ctx: HookContext) -> None:
        """After the optimiser step, before the lr schedule's."""

    # --- between steps (trainer.steps, through the Run) -----------------------------------------

    def after_step(self, ctx: HookContext, step: int) -> None:
        """After step `step` is whole (applied and recorded), when the ranks have agreed that
        no one asked to stop (a request is `on_stop_request`'s instead)."""

    def on_stop_request(self, ctx: HookContext) -> None:
        """The process was asked to stop after the step just taken, which did not diverge."""

    def at_end(self, ctx: HookContext) -> None:
        """After the last step the loop takes (the run's last, or the one it diverged at)."""

    # --- in a checkpoint ------------------------------------------------------------------------

    def state_dict(self) -> Dict:
        """What a resumed run needs of this hook: entries of the checkpoint's own dict
        (Run.checkpoint_state), under keys of the hook's."""
        return {}

    def load_state_dict(self, state: Dict) -> None:
        """From the checkpoint's dict, as `state_dict` wrote it."""


MOMENTS = ("around_forward", "losses_read", "after_optimizer_step",  # in Run.step
           "after_step", "on_stop_request", "at_end")  # between steps


def by_moment(hooks: Sequence[StepHook]) -> Dict[str, List[StepHook]]:
    """Each moment -> the hooks (in order) that act at it: those that override it."""
    return {moment: [h for h in hooks if getattr(type(h), moment) is not getattr(StepHook, moment)]
            for moment in MOMENTS}


def as_step_hook(obj: Any):
    """What a registered name or dotted path leads to, as a step hook class (stabexp.plugins)."""
    from stabexp.plugins import Rejected, what_is

    if not (isinstance(obj, type) and issubclass(obj, StepHook)):
        raise Rejected(f"it names {what_is(obj)}, not a subclass of stabexp.train.hooks.StepHook")
    return obj
