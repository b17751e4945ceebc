"""stabexp's probes on a model and a training loop of one's own (docs/probes.md, "A model of your
own"): the model update ||F(x, theta_t) - F(x, theta_0)||, per-sublayer gradient norms, LN input
and stream norms, the largest attention logit, log Z, the relative update and, with "weights",
each weight matrix's norm and angular update, written as a `stabexp run` writes them
(metrics.csv, layers.csv, summary.json, the trackers), so that `stabexp report`, the API
(stabexp.api) and the figures read the folder unchanged.

    monitor = Monitor(model, probe_batch, "runs/gpt2-4L", optimizer=optimizer)
    for step in range(1, steps + 1):
        loss = ...; loss.backward()
        optimizer.step(); optimizer.zero_grad()
        monitor.step(loss)
    monitor.close()

With `optimizer=`, the gradients are read in the optimiser's step pre-hook; without it, call
`monitor.before_step()` between the backward pass and the optimiser step. Either way
`grad_norm` is the gradient as the backward pass left it (summed over accumulated
micro-batches), before any clipping of the loop's: at the steps to probe, a hook on each
parameter keeps its gradient's norm as the backward pass accumulates it.

A monitor takes its folder as `stabexp run` takes a run folder: it holds the folder's lock
(run.lock) until it closes, so a second monitor or a run cannot write into it meanwhile, and it
refuses a folder that holds a run's files (a run's or another monitor's), unless
`overwrite=True`, which replaces them. `LightningMonitor` and `HFTrainerMonitor` are the same
monitor as a Lightning callback and a Hugging Face Trainer callback.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Union

import torch
import torch.nn as nn
from omegaconf import DictConfig, OmegaConf

from stabexp import plugins
from stabexp.config import LoggerConfig, MlflowLogger, OptimConfig, ProbeConfig, TensorBoardLogger, TrainConfig, \
    WandbLogger
from stabexp.data import Task
from stabexp.errors import ConfigError
from stabexp.probes.adapters import Adapter, StabexpAdapter, adapter_for
from stabexp.probes.base import PROBE_BATCH, REFERENCE, STABEXP_MODEL, SUBLAYERS, ProbeContext, ProbeSet
from stabexp.probes.layers import SublayerStats
from stabexp.tracking import Trackers
from stabexp.train.files import SUMMARY, RunLock, RunLocked, summary_problem, write_json
from stabexp.train.folder import clear, run_files
from stabexp.train.recording import Recorder, eval_results

# The probes a monitor runs, by the name `probes=` takes, and the probe.<flag> that turns each on.
FLAGS = {"layers": "enabled", "weights": "weights", "at_init": "at_init", "update_bound": "update_bound",
         "dependency": "dependency", "layer_importance": "layer_importance"}
LOGGERS = {"tensorboard": TensorBoardLogger, "mlflow": MlflowLogger, "wandb": WandbLogger}
log = logging.getLogger("stabexp")


def optimiser_name(optimizer: Optional[torch.optim.Optimizer]) -> str:
    """An optimiser's name as stabexp's theory knows it (sgd, sgdm, adam, adamw), else its class."""
    if optimizer is None:
        return ""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):  # accelerate's wrapper
        optimizer = optimizer.optimizer
    kind = type(optimizer).__name__.lower()
    if kind == "sgd":
        return "sgdm" if optimizer.defaults.get("momentum", 0) > 0 else "sgd"
    return kind


def monitor_config(probes: Sequence[str], every: int, first_steps: int, optimizer, logger,
                   out_dir: Optional[Path] = None) -> DictConfig:
    """The config a monitor's probes and trackers read: stabexp's schema for `probe`, `train`,
    `optim` and `logger`, set from the arguments. The trackers' files go inside `out_dir`
    (out_dir/tensorboard, out_dir/wandb; MLflow's database out_dir/mlflow.db unless
    $MLFLOW_TRACKING_URI names one), so that a monitor writes nowhere else."""
    if not isinstance(every, int) or every < 1:
        raise ConfigError(f"every={every!r} is not allowed: an integer >= 1 (a step k is probed when k % every == 0)")
    if not isinstance(first_steps, int) or first_steps < 0:
        raise ConfigError(f"first_steps={first_steps!r} is not allowed: an integer >= 0")
    unknown = [p for p in probes if p not in FLAGS and not plugins.is_dotted_path(p)
               and p not in plugins.names("probe")]
    if unknown:
        raise ConfigError(f"probes={list(probes)} is not allowed: {unknown[0]} is none of "
                          f"{', '.join(FLAGS)} (or a registered probe, or a dotted path module.Class)")
    probe = OmegaConf.structured(ProbeConfig(every=every, first_steps=first_steps))
    for name in FLAGS.values():
        probe[name] = False
    probe.enabled = "layers" in probes
    for name in probes:
        if name in FLAGS:
            probe[FLAGS[name]] = True
        else:
            probe.extra.append(name)
    loggers = [logger] if isinstance(logger, str) else list(logger or ())
    bad = [name for name in loggers if name not in LOGGERS]
    if bad:
        raise ConfigError(f"logger={bad[0]} is not allowed: one of {', '.join(LOGGERS)}")
    group = optimizer.param_groups[0] if optimizer is not None else {}
    optim = OptimConfig(name=optimiser_name(optimizer), weight_decay=float(group.get("weight_decay", 0.0)),
                        momentum=float(group.get("momentum", 0.0) or 0.0))
    train = TrainConfig(lr=float(group.get("lr", 1.0)))
    inside = {}
    if out_dir is not None:
        out_dir = Path(out_dir).resolve()
        inside = {"tensorboard": {"dir": str(out_dir / "tensorboard")}, "wandb": {"dir": str(out_dir / "wandb")},
                  "mlflow": {} if os.environ.get("MLFLOW_TRACKING_URI") else
                  {"tracking_uri": f"sqlite:///{out_dir / 'mlflow.db'}"}}
    trackers = {n: LOGGERS[n](**inside.get(n, {})) for n in loggers}
    return OmegaConf.create({"probe": probe, "train": OmegaConf.structured(train),
                             "optim": OmegaConf.structured(optim),
                             "logger": OmegaConf.structured(LoggerConfig(**trackers))})


class Monitor:
    """stabexp's probes on `model`, written into `out_dir` as a run's files.

    probe_batch: the fixed batch every probe step measures on, as the model takes it (a dict of
    keyword inputs, a tuple of arguments, one tensor; stabexp's models: (src, tgt_in)).
    probes: "layers" (the default: model update, gradient, LN input, stream and attention
    logit per sublayer, log Z, relative update), "weights", and on stabexp's own models the
    others of probe.* ("at_init" with a `task`, "update_bound", "dependency",
    "layer_importance"); a plug-in probe by registered name or dotted path.
    every, first_steps: as probe.every and probe.first_steps (a step k is probed when
    k <= first_steps or k % every == 0). optimizer: read for the lr, the optimiser's name and
    weight decay (summary.json, the effective lr), and hooked for the gradients before each
    step. logger: "tensorboard", "mlflow", "wandb" or a list of them, their files inside
    out_dir (monitor_config). overwrite: replace the
    run's files a folder holds (refused without it). describe: what
    summary.json says of the run (group, depth, model, task, seed, ...), for `stabexp report`.
    evaluate(model) -> {"eval_loss": ..., "eval_acc": ...}: run (in eval mode) every
    `eval_every` steps and at step `steps`, the metrics row's eval columns and summary.json's
    final and best eval loss, which `stabexp report` shows.
    """

    def __init__(self, model: nn.Module, probe_batch: Any, out_dir: Union[str, Path], *,
                 probes: Sequence[str] = ("layers",), every: int = 10, first_steps: int = 20,
                 optimizer: Optional[torch.optim.Optimizer] = None, adapter: Optional[Adapter] = None,
                 logger: Union[None, str, Sequence[str]] = None, describe: Optional[Dict] = None,
                 evaluate: Optional[Callable[[nn.Module], Dict[str, float]]] = None, eval_every: int = 100,
                 steps: Optional[int] = None, config: Optional[DictConfig] = None, task=None,
                 hook_optimizer: bool = True, overwrite: bool = False, grad_scaler=None):
        self.model, self.optimizer = model, optimizer
        self.grad_scaler = grad_scaler  # fp16 mixed precision: its loss scale is divided out of grad_norm
        self.evaluate, self.eval_every, self.steps = evaluate, eval_every, steps
        self.closed = False
        if not isinstance(eval_every, int) or eval_every < 1:
            raise ConfigError(f"eval_every={eval_every!r} is not allowed: an integer >= 1")
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ConfigError(f"steps={steps!r} is not allowed: an integer >= 1, or None")
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model={_short(model)} is not allowed: a torch.nn.Module")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer={_short(optimizer)} is not allowed: a torch.optim.Optimizer (the one the "
                              "loop steps), or None")
        _check_describe(describe)
        if next(model.parameters(), None) is None:
            raise ConfigError(f"{type(model).__name__} has no parameters: the monitor measures a model's "
                              "parameters, their gradients and updates")
        self.adapter = adapter if adapter is not None else adapter_for(model)
        self.cfg = config if config is not None else monitor_config(probes, every, first_steps, optimizer, logger,
                                                                    out_dir)
        classes = plugins.probes(self.cfg)
        given = {SUBLAYERS, PROBE_BATCH, REFERENCE} | ({STABEXP_MODEL} if isinstance(self.adapter, StabexpAdapter)
                                                       else set()) | ({"task"} if task is not None else set())
        for probe in classes:
            missing = [n for n in probe.needs if n not in given]
            if missing:
                raise ConfigError(f"probe {probe.name} needs {', '.join(missing)}, which a monitor on "
                                  f"{type(model).__name__} does not give")
            if config is not None or STABEXP_MODEL not in probe.needs:
                probe.check(self.cfg)
        # Everything checked: the folder is taken (and, with overwrite, its run's files removed).
        self.out_dir = Path(out_dir)
        made = not self.out_dir.exists()
        self.lock = _take_folder(self.out_dir, overwrite)
        try:
            self._start(classes, model, probe_batch, optimizer, describe, steps, task, hook_optimizer)
        except BaseException:
            # A start that fails (a probe batch the model cannot take, say) leaves no run behind:
            # no summary.json reading "running", no header-only CSVs to refuse the next try.
            for opened in (getattr(self, "recorder", None), getattr(self, "trackers", None)):
                if opened is not None:
                    opened.close()
            clear(self.out_dir)
            self.lock.release()
            if made:
                shutil.rmtree(self.out_dir, ignore_errors=True)
            raise

    def _start(self, classes, model, probe_batch, optimizer, describe, steps, task, hook_optimizer) -> None:
        device = next(model.parameters()).device
        self.summary: Dict[str, Any] = {
            "status": "running", "group": type(model).__name__, "arch": type(model).__name__,
            "depth": sum(1 for s in self.adapter.sublayers() if s.name == "ffn"), "seed": None,
            "model": type(model).__name__, "task": None, "steps": steps, "out_dir": str(self.out_dir),
            "parameters": sum(p.numel() for p in model.parameters()),
            **(describe or {})}
        if optimizer is not None:
            self.summary["optim"] = {"name": self.cfg.optim.name, "lr": self.cfg.train.lr,
                                     "weight_decay": self.cfg.optim.weight_decay}
        self.lr: Optional[float] = None  # of the step being taken, read in before_step
        ctx = ProbeContext(model=model, adapter=self.adapter, cfg=self.cfg, device=device, summary=self.summary,
                           probe_batch=probe_batch, probe_tokens=self.adapter.feature_mask(probe_batch),
                           task=task, lr=lambda: self.lr if self.lr is not None else self.cfg.train.lr,
                           optimiser=self.cfg.optim.name)
        self.probes = ProbeSet(classes, ctx)
        self.trackers = Trackers.open(self.cfg, self.out_dir)
        self.recorder = Recorder.for_probes(self.out_dir, self.probes, Task.eval_columns, self.trackers)
        self.start, self.steps_done, self.last_loss = time.perf_counter(), 0, None
        self.trackers.start(self.summary)
        write_json(self.out_dir / SUMMARY, self.summary)
        was_training = model.training
        self._write(0, None, None, self.probes.start())
        model.train(was_training)
        self._say_which_attention_is_unobserved()
        # grad_norm is the gradient as the backward pass left it, before any clipping of the
        # loop's, as `stabexp run` reads it: kept by hooks, at the steps to probe only.
        self.gradient_watch = [p.layer_probe for p in self.probes if isinstance(p, SublayerStats)]
        scaler = self.grad_scaler
        for watch in self.gradient_watch:
            watch.watch_gradients(None if scaler is None or not scaler.is_enabled() else scaler.get_scale)
        self._arm(1)
        # A framework that steps through a closure (Lightning) runs the backward pass inside
        # optimizer.step, after its pre-hook: its callback calls before_step itself.
        self.handle = optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.before_step()) \
            if optimizer is not None and hook_optimizer else None

    def _say_which_attention_is_unobserved(self) -> None:
        """After a probe pass: where some attention logits cannot be read from the attention the
        model runs (from the first pass on, or from a later one: a term of its scores that grows
        from zero), max_attn_logit is empty there; one line says why, when it is new, and
        summary.json keeps it."""
        unobserved = getattr(self.adapter, "unobserved_attention", lambda: None)()
        if unobserved and unobserved != self.summary.get("unobserved_attention"):
            log.warning("max_attn_logit is empty where the attention is not observed: %s (docs/probes.md, "
                        "'Attention logits')", unobserved)
            self.summary["unobserved_attention"] = unobserved
            write_json(self.out_dir / SUMMARY, self.summary)

    def is_eval_step(self, step: int) -> bool:
        return self.evaluate is not None and (step % self.eval_every == 0 or step == self.steps)

    def is_probe_step(self, step: int) -> bool:
        p = self.cfg.probe
        return step <= p.first_steps or step % p.every == 0 or step == self.steps or self.is_eval_step(step)

    def before_step(self) -> None:
        """Between the backward pass and the optimiser step of the next step: its gradients."""
        self._open("before_step")
        step = self.steps_done + 1
        if self.optimizer is not None:
            self.lr = float(self.optimizer.param_groups[0]["lr"])
        self.probes.before_step(step, self.is_probe_step(step))

    def _open(self, what: str) -> None:
        if self.closed:
            raise RuntimeError(f"monitor.{what}() after monitor.close(): {self.out_dir} is closed")

    def step(self, loss: Union[None, float, torch.Tensor] = None) -> Optional[Dict]:
        """After the optimiser step: the step's rows where it is probed (its metrics row, returned)."""
        self._open("step")
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise TypeError(f"monitor.step(loss): loss is a tensor of shape {tuple(loss.shape)}: "
                                "give the step's scalar loss (or None)")
            loss = float(loss.detach())
        elif loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
            raise TypeError(f"monitor.step(loss): loss is a {type(loss).__name__} ({loss!r:.40}): "
                            "give a number, a scalar tensor or None")
        elif loss is not None:
            loss = float(loss)
        step = self.steps_done = self.steps_done + 1
        self.last_loss = loss if loss is not None else self.last_loss
        probing = self.is_probe_step(step)
        self._arm(step + 1)
        if not self.probes.due(step, probing) and not self.is_eval_step(step):
            return None
        row = self._write(step, self.lr, loss, self.probes.measure(step, probing))
        self._say_which_attention_is_unobserved()
        return row

    def _arm(self, step: int) -> None:
        """Keep the gradients of the backward passes of `step` where it is a step to probe."""
        for watch in self.gradient_watch:
            watch.arm(self.is_probe_step(step))

    def _write(self, step: int, lr, loss, rows) -> Dict:
        row = {"step": step, "lr": lr, "loss": loss}
        if step > 0 and self.is_eval_step(step):
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                scores = self.evaluate(self.model)
            self.model.train(was_training)
            if set(scores) - {"eval_loss", "eval_acc"} or "eval_loss" not in scores:
                raise ValueError(f"evaluate returned {sorted(scores)}: it returns eval_loss (and eval_acc)")
            row.update(scores)
            eval_results(self.summary, row)
        row["elapsed_s"] = time.perf_counter() - self.start
        return self.recorder.write(row, rows)

    def close(self, status: str = "completed") -> Dict:
        """The end: the probes' last rows (where a probe measures at the end), summary.json; the
        folder's lock released. A second close returns the summary and writes nothing."""
        if self.closed:
            return self.summary
        self.closed = True
        try:
            return self._finish(status)
        finally:
            self.lock.release()

    def _finish(self, status: str) -> Dict:
        if self.handle is not None:
            self.handle.remove()
        for watch in self.gradient_watch:
            watch.unwatch_gradients()
        if status == "completed" and self.steps_done > 0:
            self.recorder.write_files(self.probes.at_end(self.steps_done))
        wall = time.perf_counter() - self.start
        self.summary.update(status=status, steps=self.summary.get("steps") or self.steps_done,
                            steps_done=self.steps_done, last_loss=self.last_loss, wall_seconds=wall,
                            steps_per_second=self.steps_done / wall if wall > 0 else None)
        write_json(self.out_dir / SUMMARY, self.summary)
        self.trackers.finish(self.summary, self.out_dir)
        self.recorder.close()
        return self.summary


def _short(value) -> str:
    """A value as an error line names it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_describe(describe) -> None:
    """`describe` is a mapping of summary.json's fields; one that makes the summary no run's
    ({"depth": "two"}: the folder would read as unreadable) is refused in one line."""
    if describe is None:
        return
    if not isinstance(describe, dict):
        raise ConfigError(f"describe={_short(describe)} is not allowed: a dict of summary.json's fields")
    problem = summary_problem(describe)
    if problem is not None:
        raise ConfigError(f"describe={_short(describe)} is not allowed: {problem}")


def _take_folder(out_dir: Path, overwrite: bool) -> RunLock:
    """The folder's lock, held by the monitor; a folder a live process holds, or one holding a
    run's files (without overwrite), refused in one line with nothing written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = RunLock(out_dir).acquire()
    except RunLocked as err:
        raise ConfigError(str(err)) from None
    present = [name for name in run_files() if (out_dir / name).exists()]
    if present and not overwrite:
        lock.release()
        raise ConfigError(f"{out_dir} holds a run's files ({', '.join(present[:3])}): give the monitor a folder "
                          "of its own, or overwrite=True to replace that run")
    if present:
        clear(out_dir)
    return lock


def _lightning_callback_base():
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback
        except ImportError:
            return object
    return Callback


class LightningMonitor(_lightning_callback_base()):
    """A Monitor as a Lightning callback: built when training starts (on the LightningModule and
    its first optimiser), the gradients read in `on_before_optimizer_step` (before Lightning
    clips them), a step written at each training batch's end with its loss; closed at the end.
    Arguments: those of Monitor but the model and optimiser."""

    def __init__(self, probe_batch: Any, out_dir: Union[str, Path], **options):
        self.probe_batch, self.out_dir, self.options = probe_batch, out_dir, options
        self.monitor: Optional[Monitor] = None

    def on_train_start(self, trainer, pl_module) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.monitor = Monitor(pl_module, self.probe_batch, self.out_dir, optimizer=optimizer, hook_optimizer=False,
                               grad_scaler=getattr(trainer.precision_plugin, "scaler", None), **self.options)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.monitor.before_step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.monitor.steps_done:  # a batch of gradient accumulation
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.monitor.step(loss)

    def on_train_end(self, trainer, pl_module) -> None:
        self.monitor.close()


def _hf_callback_base():
    try:
        from transformers import TrainerCallback
    except ImportError:
        return object
    return TrainerCallback


class HFTrainerMonitor(_hf_callback_base()):
    """A Monitor as a Hugging Face Trainer callback: built when training begins (on the
    Trainer's model and optimiser), the gradients read in `on_pre_optimizer_step` as the
    backward passes left them (the Trainer has clipped them by then: the monitor's hooks kept
    their norms before; `grad_norm` equals the Trainer's logged one), a step written at each step's end with
    the loss of its last forward pass (the model's output `loss`); closed at the end. Arguments:
    those of Monitor but the model and optimiser."""

    def __init__(self, probe_batch: Any, out_dir: Union[str, Path], **options):
        self.probe_batch, self.out_dir, self.options = probe_batch, out_dir, options
        self.monitor: Optional[Monitor] = None
        self.loss: Optional[torch.Tensor] = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.monitor = Monitor(model, self.probe_batch, self.out_dir, optimizer=optimizer, hook_optimizer=False,
                               grad_scaler=getattr(optimizer, "scaler", None), **self.options)

        def keep_loss(module, inputs, output):
            if module.training and getattr(output, "loss", None) is not None:
                self.loss = output.loss.detach()
        self.loss_hook = model.register_forward_hook(keep_loss)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.monitor.before_step()

    def on_step_end(self, args, state, control, **kwargs):
        self.monitor.step(self.loss)

    def on_train_end(self, args, state, control, **kwargs):
        self.loss_hook.remove()
        self.monitor.close()
