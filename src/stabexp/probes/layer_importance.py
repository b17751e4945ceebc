"""Layer importance: how much the eval loss rises when one layer is skipped (its sublayers
replaced by the identity, so the layer hands its input on unchanged). It is the measure behind
"The Curse of Depth" (Sun et al. 2025, arXiv 2502.05795, Sec. 3, Fig. 2: in Pre-LN LLMs the
deep layers can be removed at little cost) and Mix-LN (Li et al. 2024, arXiv 2412.13795,
Fig. 1: the performance drop per removed layer).

Like every probe it watches the model from outside: a forward hook on the layer returns the
layer's input as its output (`hooked`, probes/__init__.py), so one eval pass per layer, plus one
with no layer skipped, on the task's own eval loss (the validation set a run's eval uses).
"""

from __future__ import annotations

from typing import Callable, Dict, List

import torch.nn as nn

from stabexp.probes import hooked
from stabexp.errors import ConfigError
from stabexp.probes.base import GATHER, STABEXP_MODEL, TASK, Probe, ProbeContext, Rows, refuse_unless

# The built-in tasks whose ranks score eval batches of their own (Task.same_eval_on_every_rank).
SHARED_EVAL = ("translation", "lm")


def _pass_input_on(module, inputs, output):
    return inputs[0]


def layer_importance(model: nn.Module, eval_loss: Callable[[nn.Module], float]) -> List[Dict]:
    """One row per layer, bottom-up per stack: the eval loss with that layer skipped, the full
    model's, and the increase (`loss_increase`, positive when the layer helps)."""
    full = eval_loss(model)
    rows = []
    for stack in ("encoder", "decoder"):
        for layer, module in enumerate(getattr(model, stack), start=1):
            with hooked([(module, "post", _pass_input_on)]):
                skipped = eval_loss(model)
            rows.append({"stack": stack, "layer": layer, "eval_loss": skipped, "full_eval_loss": full,
                         "loss_increase": skipped - full})
    return rows


class LayerImportance(Probe):
    """probe.layer_importance: the eval-loss increase of skipping each layer, at init and at the
    end of a completed run, into layer_importance.csv: one eval pass per layer each time."""

    name = flag = "layer_importance"
    needs = (TASK, STABEXP_MODEL)
    # Under FSDP2 every rank runs the same eval passes, each layer gathered by FSDP as it runs:
    # every rank has the numbers, rank 0 writes them (a task whose ranks score shares of their
    # own would need the whole model gathered once per layer skipped: refused).
    combine = GATHER
    files = {"layer_importance.csv": ("step", "stack", "layer", "eval_loss", "full_eval_loss", "loss_increase")}

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        refuse_unless(cls, cfg, cfg.model.arch != "normmlp", "skips Transformer layers, and model=normmlp has none")
        refuse_unless(cls, cfg, cfg.train.parallel != "fsdp" or cfg.task.kind not in SHARED_EVAL,
                      f"must be false with train.parallel=fsdp on task.kind={cfg.task.kind}, whose ranks score "
                      "eval batches of their own (the synthetic tasks score one batch on every rank): "
                      "use train.parallel=ddp")

    def __init__(self, ctx: ProbeContext):
        super().__init__(ctx)
        if ctx.sharded and not getattr(ctx.task, "same_eval_on_every_rank", False):  # a plug-in task
            raise ConfigError(f"probe.layer_importance=True is not allowed: must be false with train.parallel=fsdp "
                              f"on {type(ctx.task).__name__}, whose ranks score eval batches of their own: "
                              "use train.parallel=ddp")

    def at_init(self) -> Rows:
        return self._rows(0)

    def at_end(self, step: int) -> Rows:
        return self._rows(step)

    def _rows(self, step: int) -> Rows:
        rows = layer_importance(self.ctx.model, self.ctx.task.eval_loss)
        return Rows(files={"layer_importance.csv": [{"step": step, **r} for r in rows]})
