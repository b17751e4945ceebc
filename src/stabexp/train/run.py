"""A run's live state and its one step: model, optimiser, lr schedule, probes, hooks and open files.

train/trainer.py drives a Run through its steps; the benchmark (bench.py) times `Run.step`
itself, so both measure the same code path. `Run.step` is the loop of one step and nothing
else: what acts on the run from outside it (the divergence check, QK-Clip, the checkpoints,
another package's hooks) is a StepHook (train/hooks.py), called at its moments with a
HookContext; the run keeps its own books (its losses as read, its step count, its files). A Run is built new (the model
initialised, step 0 recorded) or from a checkpoint (train/checkpoint.py), which it continues
bit for bit. What it is built from: train/build.py; what its probes measure: stabexp.probes
(each a Probe, called at its moments by a ProbeSet); how their rows reach the files:
train/recording.py.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from omegaconf import DictConfig

from stabexp import distributed, plugins
from stabexp.data import Task
from stabexp.probes.base import Rows
from stabexp.train import checkpoint
from stabexp.train.build import Cadence, describe, device_of, lr_schedule, model_for, probes_for
from stabexp.train.files import SUMMARY, write_json
from stabexp.train.hooks import HookContext, by_moment
from stabexp.train.losses import training_loss, update_count
from stabexp.train.optim import build_optimizer, clip_gradients
from stabexp.train.recording import Progress, Recorder, eval_results
from stabexp.tracking import Trackers

log = logging.getLogger("stabexp")


class Run:
    """One run's live state. `state`: a checkpoint to continue from, else a new run."""

    def __init__(self, cfg: DictConfig, out_dir: Path, summary: Dict, start: float, task: Task,
                 show_progress: bool = True, state: Optional[Dict] = None, trackers: Optional[Trackers] = None):
        self.cfg, self.out_dir, self.summary, self.task = cfg, Path(out_dir), summary, task
        self.trackers = trackers if trackers is not None else Trackers()  # they see every row written
        # A resumed run's clock continues where the checkpoint left it (elapsed_s).
        self.start = start - (state["elapsed"] if state else 0.0)
        t = cfg.train
        self.device, self.world = device_of(t.device), distributed.world()
        threads = t.threads or (self._threads_started_with(summary) if state else 0)
        self.threads_before = torch.get_num_threads()  # given back at close: a sweep's next run in this process
        if threads:
            torch.set_num_threads(threads)
        # Every rank alike: the same init and the same global batches (stabexp.distributed).
        torch.manual_seed(cfg.seed)
        probe_src, probe_tgt_in, _ = task.probe_batch()
        self.model = model = model_for(cfg, task, self.device)
        if state is None:
            describe(cfg, model, task, self.device, summary)
        elif not distributed.active():  # in a process group, through DCP once the optimiser exists
            model.load_state_dict(state["model"])
        # The training forward may be wrapped (DDP, FSDP2) and compiled; the probes run the
        # eager model (same weights) and hook its submodules, which a compiled graph would not
        # call, and which DDP's forward would make part of the gradient reduction.
        self.train_model = distributed.wrap(model, t.parallel, self.device)
        if t.compile:
            self.train_model = torch.compile(self.train_model)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")
        # What acts on the run (train/hooks.py): only those the config turns on, and at each
        # moment only those that act there.
        self.hooks = [hook.from_config(model, cfg) for hook in plugins.step_hooks(cfg)]
        self.at = by_moment(self.hooks)
        self.opt = build_optimizer(cfg, model, self.device)  # after wrapping: FSDP2 swaps in shards
        self.pending_losses: List[Tuple[int, float, torch.Tensor]] = []  # (step, lr, loss) not read yet
        self.sched = lr_schedule(cfg, self.opt)
        self.lr = self.sched.get_last_lr()[0]  # of the step just taken: the probes' ctx.lr()
        self.probes = probes_for(cfg, model, task, (probe_src, probe_tgt_in), self.device, summary, lambda: self.lr)
        if state is None:
            write_json(self.out_dir / SUMMARY, summary)  # status "running": visible while it trains
        self.cadence = Cadence(cfg, self.device)
        self.progress = Progress(cfg, show_progress and distributed.is_rank0())
        self.ctx = HookContext(model=model, optimizer=self.opt, cfg=cfg, chance_loss=task.chance_loss,
                               first_loss=lambda: self.result["first_loss"],
                               is_checkpoint_step=self.cadence.is_checkpoint_step,
                               save_checkpoint=self.save_checkpoint)
        if state is None:
            self._begin()
        else:
            self._restore(state)

    def _threads_started_with(self, summary: Dict) -> int:
        """A resumed run on the CPU goes on at the torch threads it started with, whatever its
        launcher gives this process (a sweep of another size packs at other threads): the order
        a sum is split over threads moves the last digits, so another count would make its
        numbers differ from an uninterrupted run's. train.threads, where set, decides instead."""
        started = summary.get("threads")
        if self.device.type != "cpu" or not started or started == torch.get_num_threads():
            return 0
        log.info("resumed at the %d thread(s) it started with (this process had %d)", started,
                 torch.get_num_threads())
        return int(started)

    def _begin(self) -> None:
        """A new run: its files, the probes at init, and the step-0 rows."""
        self.trackers.start(self.summary)  # the config and the init rule's constants
        self.recorder = Recorder.for_probes(self.out_dir, self.probes, self.task.eval_columns, self.trackers)
        self.steps_done = 0
        self.result = {"status": "completed", "diverged_at_step": None, "first_loss": None,
                       "last_loss": None, "best_eval_loss": None, "final_eval_loss": None,
                       "final_eval_acc": None}
        self.model.train()
        with distributed.layer_by_layer(self.model):
            rows = self.probes.start()
        self._record(0, None, None, rows)
        if distributed.rank() > 0:
            # Dropout masks of their own on the other ranks (rank 0 goes on with the seed's stream).
            torch.manual_seed(self.cfg.seed + 1_000_003 * distributed.rank())

    # --- checkpoints ---------------------------------------------------------------------------

    def checkpoint_state(self) -> Dict:
        """Everything a resumed run needs (train/checkpoint.py), at the end of step steps_done."""
        # K processes: the model and optimiser go through DCP (checkpoint.save), not this dict.
        tensors = ({"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}
                   if not distributed.active() else {})
        # The hooks' state (the divergence check's explode_at) among the run's own keys, where
        # it has always stood: older checkpoints resume as they are.
        hooks = {key: value for hook in self.hooks for key, value in hook.state_dict().items()}
        return {"config": checkpoint.config_text(self.cfg), "step": self.steps_done, **tensors,
                "schedule": self.sched.state_dict(), "rng": checkpoint.rng_state(),
                "task": self.task.state_dict(), "probes": self.probes.state_dict(), "result": dict(self.result),
                **hooks, "summary": self.summary, "trackers": self.trackers.state(),
                "elapsed": time.perf_counter() - self.start, "csv": self.recorder.positions()}

    def _restore(self, state: Dict) -> None:
        if not distributed.active():
            self.opt.load_state_dict(state["optimizer"])
        else:
            checkpoint.load_model_and_optimizer(state, self.model, self.opt, self.probes.state_dict())
        self.sched.load_state_dict(state["schedule"])
        self.probes.load_state_dict(state["probes"])
        self.result = dict(state["result"])
        for hook in self.hooks:
            hook.load_state_dict(state)
        self.steps_done = state["step"]
        # Rows written after the checkpoint are cut: the resumed run writes them again.
        self.recorder = Recorder.for_probes(self.out_dir, self.probes, self.task.eval_columns, self.trackers, state)
        self.task.load_state_dict(state["task"])
        self.model.train()
        checkpoint.set_rng_state(state["rng"])  # last: building the run above drew from it

    def save_checkpoint(self) -> None:
        """The checkpoint, then summary.json saying where a resumed run would start
        (`stabexp status` reads it there, without loading the checkpoint)."""
        self.recorder.sync()
        checkpoint.save(self.out_dir, self.checkpoint_state(), self.model, self.opt)
        self.summary["checkpoint_step"] = self.steps_done
        write_json(self.out_dir / SUMMARY, self.summary)

    # --- the step ------------------------------------------------------------------------------

    def step(self, step: int) -> bool:
        """Optimiser step number `step` (1-based), probing if due; False when a hook ended the
        run at it (the divergence check: the step is not applied)."""
        t, cadence, model = self.cfg.train, self.cadence, self.model
        batches = [self.task.train_batch() for _ in range(t.update_freq)]
        with ExitStack() as around:
            for hook in self.at["around_forward"]:
                around.enter_context(hook.around_forward(self.ctx))
            loss = self._gradient(batches)
        lr = self.sched.get_last_lr()[0]
        self.pending_losses.append((step, lr, loss.detach()))
        if cadence.must_sync(step) and self.read_losses():
            return False
        probing = cadence.is_probe_step(step)
        self.probes.before_step(step, probing)  # this step's gradients, before clipping
        if t.clip_norm > 0:
            clip_gradients(model, t.clip_norm, distributed.is_sharded(model))
        self.opt.step()
        for hook in self.at["after_optimizer_step"]:
            hook.after_optimizer_step(self.ctx)
        self.sched.step()
        self.steps_done, self.lr = step, lr
        row = None
        if self.probes.due(step, probing) or cadence.is_eval_step(step):
            with distributed.layer_by_layer(model):
                rows = self.probes.measure(step, probing)
            row = self._record(step, lr, self.result["last_loss"], rows)
        # The loss shown is this step's where the host has read it (the divergence check reads
        # at Cadence.must_sync), none elsewhere.
        self.progress.update(step, self.result["last_loss"] if cadence.must_sync(step) else None,
                             row.get("model_update") if row else None)
        return True

    def _gradient(self, batches) -> torch.Tensor:
        """The step's loss (on device), its gradient left in the parameters' .grad. Several
        batches (train.update_freq): each one's forward and backward in turn, its summed token
        loss over the count of all of theirs, so that the gradients add up to the gradient of
        the mean over every token of the step (fairseq's --update-freq), at the memory of one
        batch; the loss returned is that mean."""
        t = self.cfg.train
        # K ranks: DDP and FSDP2 average the gradients over the ranks, so K times each share's
        # part of the mean gives the gradient of the mean (stabexp.distributed).
        if len(batches) == 1:
            with self.autocast:
                loss = training_loss(self.train_model, self.task, batches[0], t.z_loss, self.world)
            self.opt.zero_grad(set_to_none=True)
            (loss if self.world == 1 else loss * self.world).backward()
            return loss
        count = update_count(self.task, batches)
        # Zeroed in place, not set to None: under DDP a backward outside its reduction (no_sync)
        # would put the gradients in new tensors beside DDP's buckets, whose views they are
        # otherwise (gradient_as_bucket_view), a second copy of them on every rank. The same
        # numbers either way (0 + g is g).
        self.opt.zero_grad(set_to_none=False)
        parts = []
        for i, batch in enumerate(batches):
            with distributed.accumulating(self.train_model, last=i == len(batches) - 1):
                with self.autocast:
                    part = training_loss(self.train_model, self.task, batch, t.z_loss, self.world, count)
                (part * self.world).backward()
            parts.append(part.detach())
        return torch.stack(parts).sum()

    # --- between steps: the hooks' moments that the loop (train/trainer.py) calls ----------------

    def read_losses(self) -> bool:
        """Read the losses of the steps since the last read (one host sync): the run's first and
        last loss, then the hooks' `losses_read`; True when one ended the run at a step (it
        diverged: that step's row written, the step not applied, the steps after it void)."""
        if not self.pending_losses:
            return False
        steps, lrs, losses = zip(*self.pending_losses)
        self.pending_losses = []
        # K ranks: each holds its part of every step's loss; their sum (one collective) is the
        # batch's loss, the same on every rank, so all of them stop at the same step.
        readings = list(zip(steps, lrs, distributed.sum_(torch.stack(losses)).float().tolist()))
        if self.result["first_loss"] is None:
            self.result["first_loss"] = readings[0][2]
        for hook in self.at["losses_read"]:
            ended = hook.losses_read(self.ctx, readings)
            if ended is not None:
                step, lr, loss = next(r for r in readings if r[0] == ended)
                self.result.update(status="diverged", diverged_at_step=step, last_loss=loss)
                self.steps_done = step - 1
                self.recorder.metrics.write([{"step": step, "lr": lr, "loss": loss,
                                              "elapsed_s": time.perf_counter() - self.start}])
                log.warning("diverged at step %d (loss %s)", step, loss)
                return True
        self.result["last_loss"] = readings[-1][2]
        return False

    def after_step(self, step: int) -> None:
        """Step `step` is whole and no stop was asked for: the periodic checkpoint."""
        for hook in self.at["after_step"]:
            hook.after_step(self.ctx, step)

    def on_stop_request(self) -> bool:
        """The process was asked to stop after the step just taken: the losses not read yet are
        read, then the hooks act (the checkpoint written). True when the run diverged among
        those losses instead (no checkpoint)."""
        if self.read_losses():
            return True
        for hook in self.at["on_stop_request"]:
            hook.on_stop_request(self.ctx)
        return False

    def at_end(self) -> None:
        """The loop is over: the losses not read yet are read (a divergence among them is recorded)."""
        self.read_losses()
        for hook in self.at["at_end"]:
            hook.at_end(self.ctx)

    def _record(self, step: int, lr: Optional[float], loss: Optional[float], rows: Rows) -> Dict:
        """The rows of `step`: the probes' (measured on theta_step) and, at an eval step, the
        task's eval columns, which also update the run's best and final eval results."""
        row = {"step": step, "lr": lr, "loss": loss}
        if self.cadence.is_eval_step(step):
            # FSDP2: the model whole where ranks score shares of their own (their forwards differ).
            with (distributed.layer_by_layer(self.model) if self.task.same_eval_on_every_rank
                  else distributed.full_weights(self.model)):
                row.update(self.task.evaluate(self.model, step))
            eval_results(self.result, row)
            self.task.summarise_eval(row, self.result)
        row["elapsed_s"] = time.perf_counter() - self.start
        return self.recorder.write(row, rows)

    def write_final(self) -> None:
        """What a completed run keeps of its last weights: the probes' rows at the end (the
        residual dependency, the layer importance) and, with train.save_model, the weights."""
        with distributed.layer_by_layer(self.model):
            self.recorder.write_files(self.probes.at_end(self.steps_done))
        if self.cfg.train.save_model:
            checkpoint.save_final_weights(self.out_dir, self.model, self.task)

    def close(self) -> None:
        self.recorder.close()
        self.progress.close()
        torch.set_num_threads(self.threads_before)
