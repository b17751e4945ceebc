"""What a run is built from: its device, its model (initialised and described in the summary, or
as a checkpoint left it), its lr schedule, its probes and the files they fill, and when it
probes, evaluates, checkpoints and reads its loss (`Cadence`). train/run.py puts them together.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Dict

import torch
from omegaconf import DictConfig

from stabexp import distributed, plugins, theory
from stabexp.config import ConfigError
from stabexp.data import Task
from stabexp.model import build_model, initialise
from stabexp.model.transformer import DecoderLayer, EncoderLayer
from stabexp.probes.adapters import StabexpAdapter
from stabexp.probes.base import ProbeContext, ProbeSet
from stabexp.train.schedule import factor_of
from stabexp.theory import torch_form


def device_of(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        # Checked here, on the host that runs the job, not where a sweep is submitted from.
        raise ConfigError("train.device=cuda is not allowed here: this torch sees no CUDA device "
                          "(use train.device=cpu or auto)")
    return torch.device(name)


def check_parallel(cfg: DictConfig, task: Task) -> None:
    """What FSDP2 could not shard, found before anything is written: the model built on the
    meta device (no memory, no init) and checked."""
    if cfg.train.parallel == "fsdp":
        with torch.device("meta"):
            model = build_model(cfg, task.vocab_size, task.pad_id, task.max_positions)
        distributed.check_shardable(model)


def reads_loss_every_step(device: torch.device) -> bool:
    """Whether the host reads every step's loss (exactly when it is computed), or only at the
    steps that sync anyway (Cadence.must_sync): reading costs nothing on a CPU, a stall on a GPU."""
    return device.type == "cpu"


def model_for(cfg: DictConfig, task: Task, device: torch.device) -> torch.nn.Module:
    """The run's model on `device`, not yet initialised (the caller seeds first); under FSDP
    sharded layer by layer as it is built (distributed.build_sharded)."""
    def build():
        return build_model(cfg, task.vocab_size, task.pad_id, task.max_positions)

    if cfg.train.parallel == "fsdp":
        model = distributed.build_sharded(build, lambda m: isinstance(m, (EncoderLayer, DecoderLayer)), device,
                                          bf16=cfg.train.precision == "bf16")
    else:
        model = distributed.on_device(build(), device)
    model.checkpoint_layers = cfg.train.activation_checkpointing
    return model


def describe(cfg: DictConfig, model: torch.nn.Module, task: Task, device: torch.device, summary: Dict) -> None:
    """Initialise the model and put what the run resolved into the summary."""
    t, o = cfg.train, cfg.optim
    with distributed.whole_draws(model) if distributed.is_sharded(model) else nullcontext():
        summary["constants"] = initialise(model, cfg.group.init, task.init_batch)
    summary["parameters"] = sum(p.numel() for p in model.parameters())
    summary["chance_loss"] = task.chance_loss
    summary.update(task.info())
    summary["device"] = str(device)
    summary["precision"] = t.precision
    # What else moves the last digits: the order in which a sum is split over threads (a run
    # on 1 and on 2 threads part at the fourth step), and the torch build.
    summary["threads"], summary["torch"] = torch.get_num_threads(), str(torch.__version__)
    summary["optim"] = {"name": o.name, "lr": t.lr, "weight_decay": o.weight_decay,
                        "momentum": o.momentum, "beta1": o.betas[0], "decay_on": o.decay_on}
    name, weight_decay = torch_form(o.name, o.weight_decay, t.lr)
    if o.weight_decay > 0 and name in theory.OPTIMISERS:  # the equilibria are derived for these
        summary["theory"] = theory.equilibrium(name, t.lr, weight_decay, o.momentum, o.betas[0])


def lr_schedule(cfg: DictConfig, optimiser: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    factor = factor_of(cfg)
    return torch.optim.lr_scheduler.LambdaLR(optimiser, lambda i: factor(i + 1))


def probes_for(cfg: DictConfig, model: torch.nn.Module, task: Task, probe_batch, device: torch.device,
               summary: Dict, lr) -> ProbeSet:
    """The probes the config turns on (stabexp.plugins.probes), seeing the run through one
    ProbeContext; `lr()`: the lr of the step just taken."""
    src, tgt_in = probe_batch
    sharded = distributed.is_sharded(model)
    ctx = ProbeContext(model=model, adapter=StabexpAdapter(model), cfg=cfg, device=device, summary=summary, probe_batch=(src, tgt_in),
                       probe_tokens=model.feature_mask(src, tgt_in), task=task, lr=lr, sharded=sharded,
                       optimiser=torch_form(cfg.optim.name, cfg.optim.weight_decay, cfg.train.lr)[0],
                       reduce_sum=distributed.sum_, gather=distributed.gather)
    return ProbeSet(plugins.probes(cfg), ctx)


class Cadence:
    """When a run probes, evaluates, checkpoints and reads its loss."""

    def __init__(self, cfg: DictConfig, device: torch.device):
        self.train, self.probe = cfg.train, cfg.probe
        # A CPU reads each loss at once (no cost); a GPU would stall behind its queue, so there
        # the loss is checked on device and read at the steps that sync anyway (`must_sync`).
        self.sync_every_step = reads_loss_every_step(device)

    def is_eval_step(self, step: int) -> bool:
        # A run of 0 steps measures at init only (probe.at_init): scoring a validation split
        # with a 100-layer d = 512 model would cost more than the probes.
        return self.train.steps > 0 and (step % self.train.eval_every == 0 or step == self.train.steps)

    def is_probe_step(self, step: int) -> bool:
        p = self.probe
        return p.enabled and (step <= p.first_steps or step % p.every == 0 or self.is_eval_step(step))

    def is_checkpoint_step(self, step: int) -> bool:
        every = self.train.checkpoint_every
        return every > 0 and step % every == 0 and step < self.train.steps

    def must_sync(self, step: int) -> bool:
        """Steps where the host reads the loss: every step on the CPU; elsewhere the first (it
        sets the explosion threshold), probe, eval, checkpoint, log and last steps."""
        return (self.sync_every_step or step == 1 or step == self.train.steps or self.is_probe_step(step)
                or self.is_eval_step(step) or self.is_checkpoint_step(step) or step % self.probe.log_every == 0)
