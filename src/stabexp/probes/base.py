"""The one shape every probe has (docs/probes.md), in the way of OLMo-core's callbacks: a class
that says what it needs, when it runs, what rows it returns for which file, what of the config
it refuses, what it keeps for an exact resume, and how its numbers combine over K processes.

A run (train/run.py) or a monitor on a model of one's own (stabexp.monitor) builds the probes
the config turns on (`build`), calls each at its moments and writes the rows they return
(train/recording.py): a probe never opens a file or reads the trainer's state. A probe is
registered as placements are (stabexp.plugins, kind "probe"): the built-ins in
probes/builtin.py, another package's through the `stabexp.probes` entry point group, a module
of one's own by dotted path; `probe.<flag>` turns a built-in on, `probe.extra=[name, ...]`
any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
from omegaconf import DictConfig

from stabexp.errors import need

# What a probe may need of the run (`Probe.needs`); a monitor says which it can give.
SUBLAYERS = "sublayers"      # the model's residual sublayers, their stream norms and attention
PROBE_BATCH = "probe_batch"  # a fixed batch, the same at every probe step
REFERENCE = "reference"      # F(x, theta_0) on the probe batch, taken at init and kept for resume
TASK = "task"                # the task: its init batches, loss, and eval loss
STABEXP_MODEL = "stabexp_model"  # stabexp's own model: its placements' formulas and branches
NEEDS = (SUBLAYERS, PROBE_BATCH, REFERENCE, TASK, STABEXP_MODEL)

# How a probe's numbers combine over K processes (`Probe.combine`). Under DDP every rank holds
# the whole model and computes the same numbers, which rank 0 writes; under FSDP2 a rank holds
# shards, and only a probe that says how to combine them runs.
REPLICATED = "replicated"        # from whole weights outside the gathered passes: not under FSDP
SUM_OF_SQUARES = "sum_of_squares"  # norms from the local shards, squared sums added over ranks
GATHER = "gather"                # every rank's values (or shards) gathered
COMBINE = (REPLICATED, SUM_OF_SQUARES, GATHER)


@dataclass
class Rows:
    """What a probe returns at one moment; the recorder merges every probe's into the files.

    metrics: columns of the step's metrics.csv row; sublayers: one dict of layers.csv columns
    per residual sublayer (the context's `sublayer_keys` order), merged into that sublayer's
    row; layers: whole layers.csv rows of its own (a row per weight matrix, say), after the
    sublayer rows; files: rows for the probe's own files (`Probe.files`)."""

    metrics: Dict[str, Any] = field(default_factory=dict)
    sublayers: Optional[List[Dict[str, Any]]] = None
    layers: List[Dict[str, Any]] = field(default_factory=list)
    files: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)


@dataclass
class ProbeContext:
    """What a probe sees of the run: built once by the run or the monitor, read-only to probes."""

    model: nn.Module                 # the eager model (never the DDP / compiled wrapper)
    adapter: Any                     # where its sublayers are (stabexp.probes.adapters.Adapter)
    cfg: DictConfig                  # the run's config; a probe reads its keys under `probe`
    device: torch.device
    summary: Dict[str, Any]          # summary.json's dict: a probe may add what it resolved at init
    probe_batch: Any = None          # the fixed batch, as the adapter takes it ((src, tgt_in) for stabexp's)
    probe_tokens: Optional[torch.Tensor] = None  # the rows of F(x, theta) that are real tokens (B, T)
    task: Any = None                 # stabexp.data.Task, where the probe needs TASK
    lr: Callable[[], float] = lambda: float("nan")  # the lr of the step just taken (or the first)
    optimiser: str = ""              # the optimiser's PyTorch form (theory.effective_lr's name)
    sharded: bool = False            # FSDP2: parameters and gradients are local shards
    # How numbers combine over the K processes (`Probe.combine`): a tensor's sum over them,
    # every process's object in rank order; on one process the value itself.
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    gather: Callable[[Any], List[Any]] = lambda obj: [obj]
    features_init: Optional[torch.Tensor] = None  # F(x, theta_0), where a probe needs REFERENCE


class Probe:
    """A probe: subclass it, set the class attributes, override the moments it runs at.

    The moments, in a run's order: `at_init` once before training (θ_0), then `measure(0)`; at
    every probe step k (probe.first_steps, probe.every, the eval steps; or every `every` steps)
    `before_step(k)` after the backward pass and before the optimiser step (this step's
    gradients; clipping comes after it), then `measure(k)` after it; `at_end(n)` once a run
    completes. Each returns Rows (or None). A probe computes on device and reads back to the
    host once per moment."""

    name: str = ""                  # set when registered: its registered name or dotted path
    flag: Optional[str] = None      # a built-in's boolean key probe.<flag> that turns it on
    needs: Sequence[str] = ()       # of NEEDS
    every: Optional[int] = None     # None: at the run's probe steps; k: at every k-th step instead
    combine: str = REPLICATED       # of COMBINE
    metrics_columns: Sequence[str] = ()  # metrics.csv columns it fills (plug-ins: appended)
    layers_columns: Sequence[str] = ()   # layers.csv columns it fills (plug-ins: appended)
    files: Dict[str, Sequence[str]] = {}  # its own CSV files in the run folder: name -> columns

    def __init__(self, ctx: ProbeContext):
        self.ctx = ctx

    @classmethod
    def enabled(cls, cfg: DictConfig) -> bool:
        """A built-in's flag (stabexp.plugins.probes adds those of probe.extra)."""
        return cls.flag is not None and bool(cfg.probe[cls.flag])

    @classmethod
    def config_key(cls) -> str:
        """The key that turns it on, for messages."""
        return f"probe.{cls.flag}" if cls.flag is not None else "probe.extra"

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        """Refuse a config it cannot run with (ConfigError, one line; `refuse_unless`). The
        base refuses what every probe needs: FSDP2 for a probe that reads whole weights."""
        refuse_unless(cls, cfg, cfg.train.parallel != "fsdp" or cls.combine != REPLICATED,
                      f"{'must be false' if cls.flag is not None else 'cannot run'} with train.parallel=fsdp "
                      "(this probe reads whole weight matrices or runs outside the gathered-weight passes): "
                      "use train.parallel=ddp")

    def is_due(self, step: int, probe_step: bool) -> bool:
        """Whether it measures at optimiser step `step` (`probe_step`: one of the run's)."""
        return probe_step if self.every is None else step % self.every == 0

    # --- the moments -----------------------------------------------------------------------
    def at_init(self) -> Optional[Rows]:
        return None

    def before_step(self, step: int) -> None:
        pass

    def measure(self, step: int) -> Optional[Rows]:
        return None

    def at_end(self, step: int) -> Optional[Rows]:
        return None

    # --- an exact resume ------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Tensors and plain data (a checkpoint is read with weights_only=True); the keys share
        one namespace with the other probes': prefix them with the probe's name."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        pass


def refuse_unless(probe, cfg: DictConfig, ok: bool, allowed: str) -> None:
    """ConfigError '<the key that turns it on>=<its value> is not allowed: <allowed>' unless ok."""
    value = cfg.probe[probe.flag] if probe.flag is not None else probe.name
    need(ok, probe.config_key(), value, allowed)


def as_probe(obj: Any):
    """What a registered name or dotted path leads to, as a probe class (stabexp.plugins)."""
    from stabexp.plugins import Rejected, what_is

    if not (isinstance(obj, type) and issubclass(obj, Probe)):
        raise Rejected(f"it names {what_is(obj)}, not a subclass of stabexp.probes.base.Probe")
    bad = [n for n in obj.needs if n not in NEEDS]
    if bad:
        raise Rejected(f"{obj.__qualname__}.needs names {', '.join(bad)}; a probe may need {', '.join(NEEDS)}")
    if obj.combine not in COMBINE:
        raise Rejected(f"{obj.__qualname__}.combine is {obj.combine!r}; one of {', '.join(COMBINE)}")
    return obj


class ProbeSet:
    """The probes of one run (or monitor), called together at each moment; their Rows merged
    in order (a later probe's cell wins). F(x, theta_0) is taken once for those that need it."""

    def __init__(self, classes: Sequence[type], ctx: ProbeContext):
        self.ctx = ctx
        self.probes: List[Probe] = [cls(ctx) for cls in classes]

    def __iter__(self):
        return iter(self.probes)

    def files(self) -> Dict[str, Sequence[str]]:
        return {name: columns for p in self.probes for name, columns in p.files.items()}

    def due(self, step: int, probe_step: bool) -> List[Probe]:
        return [p for p in self.probes if p.is_due(step, probe_step)]

    def start(self) -> Rows:
        """At init: F(x, theta_0) where needed, every probe's `at_init`, then the step-0
        measurement, the at-init cells over the step-0 ones."""
        if any(REFERENCE in p.needs for p in self.probes):
            from stabexp.probes import reference_features

            self.ctx.features_init = reference_features(self.ctx.adapter, self.ctx.probe_batch)
        at_init = [p.at_init() for p in self.probes]
        return merge([p.measure(0) for p in self.due(0, True)] + at_init)

    def before_step(self, step: int, probe_step: bool) -> None:
        for p in self.due(step, probe_step):
            p.before_step(step)

    def measure(self, step: int, probe_step: bool) -> Rows:
        return merge([p.measure(step) for p in self.due(step, probe_step)])

    def at_end(self, step: int) -> Rows:
        return merge([p.at_end(step) for p in self.probes])

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"features_init": self.ctx.features_init}
        for p in self.probes:
            state.update(p.state_dict())
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        features = state.get("features_init")
        self.ctx.features_init = features.to(self.ctx.device) if features is not None else None
        for p in self.probes:
            p.load_state_dict(state)


def merge(parts: Sequence[Optional[Rows]]) -> Rows:
    """Several probes' Rows of one moment as one: metrics and sublayer cells merged (the later
    wins), whole rows and file rows in order."""
    out = Rows()
    for rows in parts:
        if rows is None:
            continue
        out.metrics.update(rows.metrics)
        if rows.sublayers is not None:
            if out.sublayers is None:
                out.sublayers = [{} for _ in rows.sublayers]
            for cells, more in zip(out.sublayers, rows.sublayers):
                cells.update(more)
        out.layers += rows.layers
        for name, file_rows in rows.files.items():
            out.files.setdefault(name, []).extend(file_rows)
    return out
