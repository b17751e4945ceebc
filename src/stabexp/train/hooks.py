"""What steers a training step from outside the loop, at named moments of `Run.step`, as
OLMo-core's callbacks do: QK-Clip (train/qk_clip.py) keeps each head's largest logit around the
forward and rescales W_q, W_k after the optimiser step. The probes, which observe rather than
steer, have moments of their own (stabexp.probes.ProbeSet). A run with no hook pays for none:
Run.step enters and calls only the hooks its config turns on."""

from __future__ import annotations

from contextlib import nullcontext


class StepHook:
    """One thing that steers the step; Run builds those whose `enabled(cfg)` is true (STEP_HOOKS
    in train/run.py), and a config is checked against each of them before the run starts."""

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

    def around_forward(self):
        """A context manager around the training forward (and loss)."""
        return nullcontext()

    def after_optimizer_step(self) -> None:
        """After the optimiser step, before the lr schedule's."""
