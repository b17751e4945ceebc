"""A run's live state and its one step: model, optimiser, lr schedule, probes and open files.

train/trainer.py drives a Run through its steps; the benchmark (bench.py) times `Run.step`
itself, so both measure the same code path. A Run is built new (the model initialised, step 0
recorded) or from a checkpoint (train/checkpoint.py), which it continues bit for bit.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from omegaconf import DictConfig

from stabexp import distributed, theory
from stabexp.config import ConfigError
from stabexp.data import Task
from stabexp.model import build_model, initialise
from stabexp.modes import eval_mode
from stabexp.probes import LayerProbe, per_token_norm, update_bound
from stabexp.probes.update_bound import UpdateBound
from stabexp.probes.at_init import grad_at_init, mean_of, output_change
from stabexp.probes.weights import WeightProbe, scale_invariance
from stabexp.train import checkpoint
from stabexp.atomic import write_atomic
from stabexp.train.files import MODEL, SUMMARY, UPDATE_BOUND, CsvLog, write_json
from stabexp.train.losses import z_loss
from stabexp.train.optim import build_optimizer, torch_form
from stabexp.train.qk_clip import QKClip
from stabexp.train.recording import (LAYERS_COLUMNS, Progress, metrics_columns, record, record_dependency,
                                     record_layer_importance)
from stabexp.train.schedule import lr_factor
from stabexp.tracking import Trackers

log = logging.getLogger("stabexp")


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
    steps that sync anyway (Run.must_sync): reading costs nothing on a CPU, a stall on a GPU."""
    return device.type == "cpu"


class Run:
    """One run's live state. `state`: a checkpoint to continue from, else a new run."""

    def __init__(self, cfg: DictConfig, out_dir: Path, summary: Dict, start: float, task: Task,
                 show_progress: bool = True, state: Optional[Dict] = None, trackers: Optional[Trackers] = None):
        self.train_cfg = cfg.train
        self.cfg, self.out_dir, self.summary, self.task = cfg, Path(out_dir), summary, task
        self.trackers = trackers if trackers is not None else Trackers()  # they see every row written
        # A resumed run's clock continues where the checkpoint left it (elapsed_s).
        self.start = start - (state["elapsed"] if state else 0.0)
        self._build_model(state)
        self._build_optimiser()  # after the model is wrapped: FSDP2 swaps in sharded parameters
        self._build_probes(state)
        if state is None:
            write_json(self.out_dir / SUMMARY, summary)  # status "running": visible while it trains
        # A CPU reads each loss at once (no cost); a GPU would stall behind its queue, so there
        # the loss is checked on device and read at the steps that sync anyway (`must_sync`).
        self.sync_every_step = reads_loss_every_step(self.device)
        self.pending: List[Tuple[int, float, torch.Tensor]] = []  # (step, lr, loss) not read yet
        self.progress = Progress(cfg, show_progress and distributed.is_rank0())
        if state is None:
            self._begin()
        else:
            self._restore(state)

    # --- building ------------------------------------------------------------------------------

    def _build_model(self, state: Optional[Dict]) -> None:
        """Seed, probe batch, the model (initialised, or the checkpoint's weights), the
        training forward (compiled or not) and its precision."""
        t = self.train_cfg
        if t.threads:
            torch.set_num_threads(t.threads)
        self.device = device = device_of(t.device)
        self.world = distributed.world()
        self.grouped = distributed.active()  # in a process group (of K >= 1): DCP checkpoints
        # Every rank alike: the same init and the same global batches (stabexp.distributed).
        torch.manual_seed(self.cfg.seed)
        self.probe_src, self.probe_tgt_in, _ = self.task.probe_batch()
        self.model = model = build_model(self.cfg, self.task.vocab_size, self.task.pad_id,
                                         self.task.max_positions).to(device)
        model.checkpoint_layers = t.activation_checkpointing
        self.probe_tokens = model.feature_mask(self.probe_src, self.probe_tgt_in)
        if state is None:
            self._describe(self.summary)
        elif not self.grouped:  # in a process group, through DCP once the optimiser exists
            model.load_state_dict(state["model"])
        # The training forward may be wrapped (DDP, FSDP2) and compiled; the probes run the
        # eager model (same weights) and hook its submodules, which a compiled graph would not
        # call, and which DDP's forward would make part of the gradient reduction.
        self.train_model = distributed.wrap(model, t.parallel, device)
        self.sharded = distributed.is_sharded(model)
        if t.compile:
            self.train_model = torch.compile(self.train_model)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")
        self.qk_clip = QKClip(model, t.qk_clip_tau) if t.qk_clip_tau > 0 else None

    def _build_optimiser(self) -> None:
        cfg, t = self.cfg, self.train_cfg
        self.opt = build_optimizer(cfg, self.model, self.device)
        self.optim_name = torch_form(cfg.optim.name, cfg.optim.weight_decay, t.lr)[0]
        schedule = cfg.group.schedule if t.schedule == "group" else t.schedule
        init_factor = None if t.warmup_init_lr is None else t.warmup_init_lr / t.lr
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda i: lr_factor(schedule, i + 1, t.warmup_steps, init_factor, t.decay_period, t.steps))

    def _build_probes(self, state: Optional[Dict]) -> None:
        p, model = self.cfg.probe, self.model
        self.probe = LayerProbe(model, reduce=distributed.sum_ if self.sharded else None) if p.enabled else None
        self.weights = WeightProbe(model) if p.enabled and p.weights else None
        init = state["probes"].get("update_bound_init") if state is not None else None
        self.bound = (UpdateBound(model, [w.to(self.device) for w in init] if init is not None else None)
                      if p.enabled and p.update_bound else None)
        if self.weights is not None:
            if state is None:
                self.scale_invariant = scale_invariance(model, lambda: model(self.probe_src, self.probe_tgt_in))
                self._equilibrium_norms(self.summary)
            else:
                self.scale_invariant = state["probes"]["scale_invariant"]

    def _describe(self, summary: Dict) -> None:
        """Initialise the model and put what the run resolved into the summary."""
        cfg, t, o = self.cfg, self.train_cfg, self.cfg.optim
        summary["constants"] = initialise(self.model, cfg.group.init, self.task.init_batch)
        summary["parameters"] = sum(p.numel() for p in self.model.parameters())
        summary["chance_loss"] = self.task.chance_loss
        summary.update(self.task.info())
        summary["device"] = str(self.device)
        summary["precision"] = t.precision
        # What else moves the last digits: the order in which a sum is split over threads (a run
        # on 1 and on 2 threads part at the fourth step), and the torch build.
        summary["threads"], summary["torch"] = torch.get_num_threads(), str(torch.__version__)
        summary["optim"] = {"name": o.name, "lr": t.lr, "weight_decay": o.weight_decay,
                            "momentum": o.momentum, "beta1": o.betas[0], "decay_on": o.decay_on}
        name, weight_decay = torch_form(o.name, o.weight_decay, t.lr)
        if o.weight_decay > 0 and name in theory.OPTIMISERS:  # the equilibria are derived for these
            summary["theory"] = theory.equilibrium(name, t.lr, weight_decay, o.momentum, o.betas[0])

    def _equilibrium_norms(self, summary: Dict) -> None:
        if "theory" not in summary:
            return
        o, t = self.cfg.optim, self.train_cfg
        # Defined by the hyper-parameters alone only for AdamW (SGD's needs the gradients).
        name, weight_decay = torch_form(o.name, o.weight_decay, t.lr)
        norms = {".".join(map(str, key)): theory.equilibrium_norm(name, t.lr, weight_decay, o.momentum,
                                                                  elements=w.numel())
                 for key, w in zip(self.weights.keys, self.weights.weights)}
        summary["theory"]["equilibrium_norm"] = norms if any(norms.values()) else None

    def _begin(self) -> None:
        """A new run: its files, F(x, theta_0), and the step-0 rows."""
        columns = metrics_columns(self.task.eval_columns)
        self.trackers.start(self.summary)  # the config and the init rule's constants
        # Exploding = above explode_factor times the larger of the chance loss and the first
        # loss (the first loss can sit far above chance: tied embeddings, strong identity path).
        self.explode_at = float("inf")
        self.metrics = CsvLog(self.out_dir / "metrics.csv", columns, on_write=self.trackers.metrics_rows)
        self.layers = CsvLog(self.out_dir / "layers.csv", LAYERS_COLUMNS, on_write=self.trackers.layers_rows)
        self.bound_log = CsvLog(self.out_dir / UPDATE_BOUND, update_bound.COLUMNS) if self.bound is not None else None
        self.steps_done = 0
        self.result = {"status": "completed", "diverged_at_step": None, "first_loss": None,
                       "last_loss": None, "best_eval_loss": None, "final_eval_loss": None,
                       "final_eval_acc": None}
        self.features_init = None
        if self.probe is not None:
            # The same pass as every later F(x, theta_i) (LayerProbe.probe_pass), so that the
            # update at step 0 is exactly 0.
            with eval_mode(self.model), distributed.full_weights(self.model):
                self.features_init = self.probe.probe_pass(self.probe_src, self.probe_tgt_in)[0].clone()
            if self.bound is not None:
                # ||F(x, theta_0)|| per token: what the bound's relative model update divides by.
                self.summary["features_init_norm"] = per_token_norm(self.features_init, self.probe_tokens).item()
        self.model.train()
        at_init = self.probe_at_init() if self.cfg.probe.at_init else None
        with distributed.full_weights(self.model):
            record(self, 0, None, None, None, at_init=at_init)
        if self.cfg.probe.dependency:
            record_dependency(self, 0)
        if self.cfg.probe.layer_importance:
            record_layer_importance(self, 0)
        if distributed.rank() > 0:
            # Dropout masks of their own on the other ranks (rank 0 goes on with the seed's stream).
            torch.manual_seed(self.cfg.seed + 1_000_003 * distributed.rank())

    def probe_at_init(self) -> Dict:
        """Admin's output change on the probe batch (mean over probe.perturbation_draws draws of
        delta) and the gradient at theta_0 (mean over probe.grad_batches batches of the init
        stream, so the training batches stay those of a run without this probe). The gradient's
        forward runs in training mode, so with dropout it draws from torch's global generator:
        the draws happen on a fork of it, and the training run's own dropout masks stay those of
        a run without this probe."""
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            return self._probe_at_init()

    def _probe_at_init(self) -> Dict:
        cfg, model, p = self.cfg, self.model, self.cfg.probe
        generator = torch.Generator().manual_seed(cfg.seed)
        change = mean_of([output_change(model, self.probe_src, self.probe_tgt_in, generator=generator)
                          for _ in range(p.perturbation_draws)])
        if p.grad_batches == 0:
            n = len(change["input_change"])
            return {**change, "grad_norm": None, "sublayer_grad_norm": [None] * n, "w2_grad_norm": [None] * n,
                    "output_grad_norm": [None] * n}
        grads = mean_of([grad_at_init(model, self.task.init_batch(), self.task.loss)
                         for _ in range(p.grad_batches)])
        return {**change, **grads}

    # --- checkpoints ---------------------------------------------------------------------------

    def checkpoint_state(self) -> Dict:
        """Everything a resumed run needs (train/checkpoint.py), at the end of step steps_done."""
        probes = {"features_init": self.features_init,
                  "weights_previous": self.weights.previous if self.weights is not None else None,
                  "scale_invariant": self.scale_invariant if self.weights is not None else None,
                  "update_bound_init": self.bound.init if self.bound is not None else None}
        # K processes: the model and optimiser go through DCP (checkpoint.save), not this dict.
        tensors = ({"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}
                   if not self.grouped else {})
        return {"config": checkpoint.config_text(self.cfg), "step": self.steps_done, **tensors,
                "schedule": self.sched.state_dict(), "rng": checkpoint.rng_state(),
                "task": self.task.state_dict(), "probes": probes, "result": dict(self.result),
                "explode_at": self.explode_at, "summary": self.summary, "trackers": self.trackers.state(),
                "elapsed": time.perf_counter() - self.start,
                "csv": {"metrics": self.metrics.position(), "layers": self.layers.position(),
                        "update_bound": self.bound_log.position() if self.bound_log else None}}

    def _restore(self, state: Dict) -> None:
        columns = metrics_columns(self.task.eval_columns)
        if not self.grouped:
            self.opt.load_state_dict(state["optimizer"])
        else:
            checkpoint.load_model_and_optimizer(state, self.model, self.opt)
        self.sched.load_state_dict(state["schedule"])
        probes = state["probes"]
        self.features_init = (probes["features_init"].to(self.device)
                              if probes["features_init"] is not None else None)
        if self.weights is not None:
            torch._foreach_copy_(self.weights.previous, [w.to(self.device) for w in probes["weights_previous"]])
        self.result, self.explode_at = dict(state["result"]), state["explode_at"]
        self.steps_done = state["step"]
        # Rows written after the checkpoint are cut: the resumed run writes them again.
        self.metrics = CsvLog(self.out_dir / "metrics.csv", columns, resume_at=state["csv"]["metrics"],
                              on_write=self.trackers.metrics_rows)
        self.layers = CsvLog(self.out_dir / "layers.csv", LAYERS_COLUMNS, resume_at=state["csv"]["layers"],
                             on_write=self.trackers.layers_rows)
        self.bound_log = (CsvLog(self.out_dir / UPDATE_BOUND, update_bound.COLUMNS,
                                 resume_at=state["csv"]["update_bound"]) if self.bound is not None else None)
        self.task.load_state_dict(state["task"])
        self.model.train()
        checkpoint.set_rng_state(state["rng"])  # last: building the run above drew from it

    def save_checkpoint(self) -> None:
        """The checkpoint, then summary.json saying where a resumed run would start
        (`stabexp status` reads it there, without loading the checkpoint)."""
        for log_file in self._logs():
            log_file.sync()
        checkpoint.save(self.out_dir, self.checkpoint_state(), self.model, self.opt)
        self.summary["checkpoint_step"] = self.steps_done
        write_json(self.out_dir / SUMMARY, self.summary)

    # --- the step ------------------------------------------------------------------------------

    def is_eval_step(self, step: int) -> bool:
        # A run of 0 steps measures at init only (probe.at_init): scoring a validation split
        # with a 100-layer d = 512 model would cost more than the probes.
        t = self.train_cfg
        return t.steps > 0 and (step % t.eval_every == 0 or step == t.steps)

    def is_probe_step(self, step: int) -> bool:
        p = self.cfg.probe
        return p.enabled and (step <= p.first_steps or step % p.every == 0 or self.is_eval_step(step))

    def is_checkpoint_step(self, step: int) -> bool:
        every = self.train_cfg.checkpoint_every
        return every > 0 and step % every == 0 and step < self.train_cfg.steps

    def must_sync(self, step: int) -> bool:
        """Steps where the host reads the loss: every step on the CPU; elsewhere the first (it
        sets the explosion threshold), probe, eval, checkpoint, log and last steps."""
        return (self.sync_every_step or step == 1 or step == self.train_cfg.steps or self.is_probe_step(step)
                or self.is_eval_step(step) or self.is_checkpoint_step(step) or step % self.cfg.probe.log_every == 0)

    def step(self, step: int) -> bool:
        """Optimiser step number `step` (1-based), probing if due; False when it diverged."""
        t, model, result = self.train_cfg, self.model, self.result
        batch = self.task.train_batch()
        with self.autocast, self.qk_clip.observing() if self.qk_clip is not None else nullcontext():
            if self.world == 1:
                src, tgt_in, tgt_out = batch
                logits = self.train_model(src, tgt_in)
                loss = self.task.loss(logits, tgt_out)
                if t.z_loss > 0:
                    loss = loss + t.z_loss * z_loss(logits, self.task.predicted(tgt_out))
            else:
                loss = self._share_loss(batch)
        self.opt.zero_grad(set_to_none=True)
        # K ranks: DDP and FSDP2 average the gradients over the ranks, so K times each share's
        # part of the mean gives the gradient of the mean (stabexp.distributed).
        (loss if self.world == 1 else loss * self.world).backward()
        lr = self.sched.get_last_lr()[0]
        self.pending.append((step, lr, loss.detach()))
        if self.must_sync(step) and self.diverged():
            return False
        probing = self.is_probe_step(step)
        grads = self.probe.grad_norms() if probing else None
        if t.clip_norm > 0:
            self._clip_gradients(t.clip_norm)
        if probing:
            self.probe.snapshot()
        if probing and self.weights is not None:
            self.weights.snapshot()
        self.opt.step()
        if self.qk_clip is not None:
            if self.world > 1:  # every replica clips by the largest logit of the global batch
                self.qk_clip.max_logits = list(distributed.max_(torch.stack(self.qk_clip.max_logits)))
            self.qk_clip.clip()
        self.sched.step()
        self.steps_done = step
        row = None
        if grads is not None or self.is_eval_step(step):
            with distributed.full_weights(model):
                row = record(self, step, lr, result["last_loss"], grads, weights_moved=probing)
        self.progress.update(step, result["last_loss"] if not self.pending else None,
                             row.get("model_update") if row else None)
        return True

    def _share_loss(self, batch) -> torch.Tensor:
        """This rank's part of the batch's loss: its rows' summed token loss (and z-loss) over
        the whole batch's count of predicted tokens; the ranks' parts add up to the mean."""
        t = self.train_cfg
        count = self.task.predicted(batch[2]).sum().clamp(min=1)
        (src, tgt_in, tgt_out), weight = distributed.share(batch)
        logits = self.train_model(src, tgt_in)
        loss = self.task.loss_sum(logits, tgt_out) / count
        if t.z_loss > 0:
            loss = loss + t.z_loss * z_loss(logits, self.task.predicted(tgt_out), count=count)
        return loss * weight

    def _clip_gradients(self, max_norm: float) -> None:
        """Total grad-norm clipping; under FSDP2 the norm of the sharded gradients comes from
        their local shards, summed across the ranks in one collective."""
        if not self.sharded:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            return
        grads = [distributed.local(p.grad) for p in self.model.parameters() if p.grad is not None]
        total = distributed.sum_(torch.stack(torch._foreach_norm(grads)).pow(2).sum()).sqrt()
        torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))

    def stop_signal(self, received: Optional[int]) -> Optional[int]:
        """The signal to stop on after this step: this process's; on K processes the one any
        rank got, agreed after every step (a CPU tensor, through gloo: no wait for a GPU), so that
        every rank checkpoints at the same step, well within torchrun's 30 s before it kills."""
        if self.world == 1:
            return received
        return int(distributed.max_(torch.tensor([received or 0])).item()) or None

    def diverged(self) -> bool:
        """Read the losses of the steps since the last read (one host sync) and check them in
        order: the first that is not finite or above the explosion threshold ends the run, with
        its row; that step is not applied (steps after it, taken before the read, are void)."""
        if not self.pending:
            return False
        steps, lrs, losses = zip(*self.pending)
        self.pending = []
        result = self.result
        # K ranks: each holds its part of every step's loss; their sum (one collective) is the
        # batch's loss, the same on every rank, so all of them stop at the same step.
        for step, lr, loss_value in zip(steps, lrs, distributed.sum_(torch.stack(losses)).float().tolist()):
            if result["first_loss"] is None:
                result["first_loss"] = loss_value
                if math.isfinite(loss_value):
                    self.explode_at = self.train_cfg.explode_factor * max(self.task.chance_loss, loss_value)
            result["last_loss"] = loss_value
            if not math.isfinite(loss_value) or loss_value > self.explode_at:
                result.update(status="diverged", diverged_at_step=step)
                self.steps_done = step - 1
                self.metrics.write([{"step": step, "lr": lr, "loss": loss_value,
                                     "elapsed_s": time.perf_counter() - self.start}])
                log.warning("diverged at step %d (loss %s)", step, loss_value)
                return True
        return False

    def write_final(self) -> None:
        """What a finished run keeps of its last weights: the residual dependency
        (probe.dependency), the layer importance (probe.layer_importance) and the weights themselves (train.save_model, for `stabexp export`)."""
        if self.cfg.probe.dependency:
            record_dependency(self, self.steps_done)
        if self.cfg.probe.layer_importance:
            record_layer_importance(self, self.steps_done)
        if self.train_cfg.save_model:
            weights = self.model.state_dict()
            if self.sharded:  # gathered whole on every rank (a collective), written by rank 0
                from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

                weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True,
                                                                                    cpu_offload=True))
            model = {"state_dict": weights, "vocab_size": self.task.vocab_size,
                     "pad_id": self.task.pad_id, "max_positions": self.task.max_positions}
            if distributed.is_rank0():
                write_atomic(self.out_dir / MODEL, lambda f: torch.save(model, f))

    def _logs(self) -> List[CsvLog]:
        return [self.metrics, self.layers] + ([self.bound_log] if self.bound_log else [])

    def close(self) -> None:
        for log_file in self._logs():
            log_file.close()
        self.progress.close()
