"""train(cfg, out_dir): one run, start to finish, writing its tidy files into out_dir.

Files (all in out_dir):
- config.yaml: the resolved config.
- metrics.csv: one row per probe step (step 0 = at init, then every step up to
  probe.first_steps, every probe.every steps, every eval step and the last step).
- layers.csv: one row per (probe step, stack, layer, sublayer).
- summary.json: status (running | completed | diverged | interrupted | failed), losses, timing,
  resolved constants, what the task says about its data; after a completed run, what the task
  measures at the end (translation: test BLEU, with test_translations.tsv).
- checkpoint.pt while the run is unfinished (train/checkpoint.py), run.lock while a process
  runs it (train/files.py).

Running the same command again on the folder of an interrupted, killed or failed run resumes
it from its checkpoint; a finished run is left as is unless overwrite=true.

The trainer asks the task (data/) for batches, the loss and the eval columns, and the model for
its outputs and residual sublayers; it knows neither's insides.

Row at step i: `loss` (the training loss, z-loss included), `grad_norm` and `lr` belong to
optimiser step i (computed on theta_{i-1}); `model_update`, `ln_input_norm`, the output log Z
(`log_z_mean`, `log_z_max`), the largest attention logit (`max_attn_logit`, layers rows) and the
eval columns are measured on theta_i, after the step; `relative_update` (layers rows) is step
i's update of each sublayer relative to its weights after it (probes/__init__.py).
With probe.weights a row per weight matrix and probe step holds its norm ||w_i||, the angular
update of step i (theta_{i-1} to theta_i, whole matrix and mean over rows), the effective lr
lr_i / ||w_i||^2 and whether the weight is scale-invariant in this model (probes/weights.py).
With probe.at_init the step-0 rows also hold the at-init probes (probes/at_init.py):
`output_change` (metrics) and `input_change` (layers) from Admin's perturbation, and
`grad_norm` / `w2_grad_norm` of one backward pass at theta_0 on a batch of the init stream.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from omegaconf import DictConfig, OmegaConf

from stabexp import theory
from stabexp.config import ConfigError, validate
from stabexp.data import Task, make_task
from stabexp.model import build_model, initialise
from stabexp.modes import eval_mode
from stabexp.probes import LayerProbe, log_z_stats, model_update, rows_for_layers
from stabexp.probes.at_init import grad_at_init, mean_of, output_change
from stabexp.probes.weights import WeightProbe, scale_invariance
from stabexp.train import checkpoint
from stabexp.train.files import SUMMARY, CsvLog, RunLock, read_summary, write_json
from stabexp.train.losses import z_loss
from stabexp.train.optim import build_optimizer, torch_form
from stabexp.train.schedule import lr_factor
from stabexp.train.stop import RunStopped, StopRequests

log = logging.getLogger("stabexp")


def metrics_columns(eval_columns) -> list:
    """metrics.csv's header: the step's own columns, then the task's eval columns."""
    return ["step", "lr", "loss", "grad_norm", "model_update", "output_change", "log_z_mean", "log_z_max",
            *eval_columns, "elapsed_s"]


METRICS_COLUMNS = metrics_columns(Task.eval_columns)  # the synthetic tasks' (translation adds eval_ppl, valid_bleu)
# A row is a residual sublayer (param empty) or, with probe.weights, one weight matrix (param set).
LAYERS_COLUMNS = ["step", "stack", "layer", "sublayer", "param", "grad_norm", "ln_input_norm",
                  "max_attn_logit", "relative_update", "input_change", "w2_grad_norm", "weight_norm", "angular_update",
                  "row_angular_update", "effective_lr", "scale_invariant", "elements"]
FINISHED = ("completed", "diverged")
# Columns and summary fields that hold wall-clock time: the only ones a resumed run may write
# differently from an uninterrupted one.
WALL_CLOCK = ("elapsed_s", "wall_seconds", "steps_per_second", "finish_seconds", "resumed_from")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        # Checked here, on the host that runs the job, not where a sweep is submitted from.
        raise ConfigError("train.device=cuda is not allowed here: this torch sees no CUDA device "
                          "(use train.device=cpu or auto)")
    return torch.device(name)


def reads_loss_every_step(device: torch.device) -> bool:
    """Whether the host reads every step's loss (exactly when it is computed), or only at the
    steps that sync anyway (Run.must_sync): reading costs nothing on a CPU, a stall on a GPU."""
    return device.type == "cpu"


def group_name(cfg: DictConfig) -> str:
    """A group is a residual placement of the Transformer; NormMLP has none: it goes by its name."""
    return cfg.model.arch if cfg.model.arch == "normmlp" else cfg.group.name


def _finished(out_dir: Path, cfg: DictConfig) -> Optional[Dict]:
    previous = read_summary(out_dir)
    if previous and previous.get("status") in FINISHED and not cfg.overwrite:
        log.info("already %s, left as is: %s (overwrite=true runs it again)", previous["status"], out_dir)
        return previous
    return None


def train(cfg: DictConfig, out_dir) -> Dict:
    """Run one experiment; return its summary (also written to out_dir/summary.json).

    A run that is already finished in out_dir is left untouched unless cfg.overwrite is set; an
    unfinished one with a checkpoint is resumed from it. The task is built first, so bad data
    (a ConfigError) stops the run before anything is written. One process per folder: a second
    one raises RunLocked. A diverged run is a result (status "diverged"); a run asked to stop
    checkpoints and raises RunStopped; an unexpected error is recorded as status "failed" and
    re-raised (its last checkpoint stays, so the same command resumes it).
    """
    validate(cfg)
    out_dir = Path(out_dir)
    if _finished(out_dir, cfg):
        return read_summary(out_dir)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    task = make_task(cfg, _device(cfg.train.device))
    lock = RunLock(out_dir).acquire()
    try:
        done = _finished(out_dir, cfg)  # finished by the process that held the lock before us
        if done:
            return done
        if lock.previous_holder:
            log.warning("took over the lock of %s, which is no longer running", lock.previous_holder)
        if cfg.overwrite:
            checkpoint.remove(out_dir)
        state = checkpoint.load(out_dir, cfg)
        if state is None:
            (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            summary = {"status": "running", "experiment": cfg.experiment or None, "scale": cfg.scale,
                       "group": group_name(cfg), "arch": cfg.model.arch, "depth": cfg.depth,
                       # A single-stack model has `depth` layers and no second stack.
                       "decoder_depth": (cfg.decoder_depth if cfg.decoder_depth is not None else cfg.depth)
                       if cfg.model.arch == "transformer" else None,
                       "seed": cfg.seed, "model": cfg.model.name, "d_model": cfg.model.d_model,
                       "task": cfg.task.name,
                       "steps": cfg.train.steps, "out_dir": str(out_dir)}
        else:
            summary = dict(state["summary"], status="running")
            summary["resumed_from"] = [*summary.get("resumed_from", []), state["step"]]
            log.info("resuming %s from its checkpoint at step %d", out_dir, state["step"])
        start = time.perf_counter()
        try:
            summary.update(_train(cfg, out_dir, summary, start, task, state))
        except (KeyboardInterrupt, RunStopped):
            summary.update(status="interrupted", wall_seconds=summary.get("wall_seconds") or
                           time.perf_counter() - start)
            write_json(out_dir / SUMMARY, summary)
            raise
        except Exception as err:
            summary.update(status="failed", error=f"{type(err).__name__}: {err}",
                           wall_seconds=time.perf_counter() - start)
            (out_dir / "error.txt").write_text(traceback.format_exc())
            write_json(out_dir / SUMMARY, summary)
            raise
        write_json(out_dir / SUMMARY, summary)
        checkpoint.remove(out_dir)
        return summary
    finally:
        lock.release()


class Run:
    """One run's live state: model, optimiser, data, probes and open files.

    train() drives it; the benchmark (bench.py) times `Run.step` itself, so both measure the
    same code path. `state`: a checkpoint to continue from (train/checkpoint.py), else a new run
    that initialises the model and records step 0.
    """

    def __init__(self, cfg: DictConfig, out_dir: Path, summary: Dict, start: float, task: Task,
                 show_progress: bool = True, state: Optional[Dict] = None):
        t = self.train_cfg = cfg.train
        self.cfg, self.out_dir, self.summary, self.task = cfg, Path(out_dir), summary, task
        # A resumed run's clock continues where the checkpoint left it (elapsed_s).
        self.start = start - (state["elapsed"] if state else 0.0)
        if t.threads:
            torch.set_num_threads(t.threads)
        self.device = device = _device(t.device)
        torch.manual_seed(cfg.seed)
        self.probe_src, self.probe_tgt_in, _ = task.probe_batch()

        self.model = model = build_model(cfg, task.vocab_size, task.pad_id, task.max_positions).to(device)
        self.probe_tokens = model.feature_mask(self.probe_src, self.probe_tgt_in)
        if state is None:
            self._describe(summary)
        else:
            model.load_state_dict(state["model"])
        # The training forward may be compiled; the probes run the eager model (same weights),
        # whose per-sublayer hooks a compiled graph would not keep.
        self.train_model = torch.compile(model) if t.compile else model
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")

        self.opt = build_optimizer(cfg, model, device)
        self.optim_name = torch_form(cfg.optim.name, cfg.optim.weight_decay, t.lr)[0]
        schedule = cfg.group.schedule if t.schedule == "group" else t.schedule
        init_factor = None if t.warmup_init_lr is None else t.warmup_init_lr / t.lr
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda i: lr_factor(schedule, i + 1, t.warmup_steps, init_factor, t.decay_period))
        self.probe = LayerProbe(model) if cfg.probe.enabled else None
        self.weights = WeightProbe(model) if cfg.probe.enabled and cfg.probe.weights else None
        if self.weights is not None:
            if state is None:
                self.scale_invariant = scale_invariance(model, lambda: model(self.probe_src, self.probe_tgt_in))
                self._equilibrium_norms(summary)
            else:
                self.scale_invariant = state["probes"]["scale_invariant"]
        if state is None:
            write_json(self.out_dir / SUMMARY, summary)  # status "running": visible while it trains

        # A CPU reads each loss at once (no cost); a GPU would stall behind its queue, so there
        # the loss is checked on device and read at the steps that sync anyway (`must_sync`).
        self.sync_every_step = reads_loss_every_step(device)
        self.pending: List[Tuple[int, float, torch.Tensor]] = []  # (step, lr, loss) not read yet
        self.progress = _Progress(cfg, show_progress)
        columns = metrics_columns(task.eval_columns)
        if state is None:
            # Exploding = above explode_factor times the larger of the chance loss and the first
            # loss (the first loss can sit far above chance: tied embeddings, strong identity path).
            self.explode_at = float("inf")
            self.metrics = CsvLog(self.out_dir / "metrics.csv", columns)
            self.layers = CsvLog(self.out_dir / "layers.csv", LAYERS_COLUMNS)
            self.steps_done = 0
            self.result = {"status": "completed", "diverged_at_step": None, "first_loss": None,
                           "last_loss": None, "best_eval_loss": None, "final_eval_loss": None,
                           "final_eval_acc": None}
            self.features_init = None
            if self.probe is not None:
                # The same pass as every later F(x, theta_i) (LayerProbe.probe_pass), so that
                # the update at step 0 is exactly 0.
                with eval_mode(model):
                    self.features_init = self.probe.probe_pass(self.probe_src, self.probe_tgt_in)[0].clone()
            model.train()
            self.record(0, None, None, None, at_init=self.probe_at_init() if cfg.probe.at_init else None)
        else:
            self._restore(state, columns)

    # --- a new run's description, a resumed run's state ---------------------------------------

    def _describe(self, summary: Dict) -> None:
        """Initialise the model and put what the run resolved into the summary."""
        cfg, t, o = self.cfg, self.train_cfg, self.cfg.optim
        summary["constants"] = initialise(self.model, cfg.group.init, self.task.init_batch)
        summary["chance_loss"] = self.task.chance_loss
        summary.update(self.task.info())
        summary["device"] = str(self.device)
        summary["precision"] = t.precision
        summary["optim"] = {"name": o.name, "lr": t.lr, "weight_decay": o.weight_decay,
                            "momentum": o.momentum, "beta1": o.betas[0], "decay_on": o.decay_on}
        if o.weight_decay > 0:
            name, weight_decay = torch_form(o.name, o.weight_decay, t.lr)
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

    def checkpoint_state(self) -> Dict:
        """Everything a resumed run needs (train/checkpoint.py), at the end of step steps_done."""
        probes = {"features_init": self.features_init,
                  "weights_previous": self.weights.previous if self.weights is not None else None,
                  "scale_invariant": self.scale_invariant if self.weights is not None else None}
        return {"config": checkpoint.config_text(self.cfg), "step": self.steps_done,
                "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "schedule": self.sched.state_dict(), "rng": checkpoint.rng_state(),
                "task": self.task.state_dict(), "probes": probes, "result": dict(self.result),
                "explode_at": self.explode_at, "summary": self.summary,
                "elapsed": time.perf_counter() - self.start,
                "csv": {"metrics": self.metrics.position(), "layers": self.layers.position()}}

    def _restore(self, state: Dict, columns) -> None:
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["schedule"])
        probes = state["probes"]
        self.features_init = (probes["features_init"].to(self.device)
                              if probes["features_init"] is not None else None)
        if self.weights is not None:
            torch._foreach_copy_(self.weights.previous, [w.to(self.device) for w in probes["weights_previous"]])
        self.result, self.explode_at = dict(state["result"]), state["explode_at"]
        self.steps_done = state["step"]
        # Rows written after the checkpoint are cut: the resumed run writes them again.
        self.metrics = CsvLog(self.out_dir / "metrics.csv", columns, resume_at=state["csv"]["metrics"])
        self.layers = CsvLog(self.out_dir / "layers.csv", LAYERS_COLUMNS, resume_at=state["csv"]["layers"])
        self.task.load_state_dict(state["task"])
        self.progress.resume_at(self.steps_done)
        self.model.train()
        checkpoint.set_rng_state(state["rng"])  # last: building the run above drew from it

    def save_checkpoint(self) -> None:
        """The checkpoint, then summary.json saying where a resumed run would start
        (`stabexp status` reads it there, without loading the checkpoint)."""
        for log_file in (self.metrics, self.layers):
            log_file.sync()
        checkpoint.save(self.out_dir, self.checkpoint_state())
        self.summary["checkpoint_step"] = self.steps_done
        write_json(self.out_dir / SUMMARY, self.summary)

    # --- probes at init --------------------------------------------------------------------------

    def probe_at_init(self) -> Dict:
        """Admin's output change on the probe batch (mean over probe.perturbation_draws draws of
        delta) and the gradient at theta_0 (mean over probe.grad_batches batches of the init
        stream, so the training batches stay those of a run without this probe)."""
        cfg, model, p = self.cfg, self.model, self.cfg.probe
        generator = torch.Generator().manual_seed(cfg.seed)
        change = mean_of([output_change(model, self.probe_src, self.probe_tgt_in, generator=generator)
                          for _ in range(p.perturbation_draws)])
        if p.grad_batches == 0:
            n = len(change["input_change"])
            return {**change, "grad_norm": None, "sublayer_grad_norm": [None] * n, "w2_grad_norm": [None] * n}
        grads = mean_of([grad_at_init(model, self.task.init_batch(), self.task.loss)
                         for _ in range(p.grad_batches)])
        return {**change, **grads}

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
                or self.is_checkpoint_step(step) or step % self.cfg.probe.log_every == 0)

    def step(self, step: int) -> bool:
        """Optimiser step number `step` (1-based), probing if due; False when it diverged."""
        t, model, result = self.train_cfg, self.model, self.result
        src, tgt_in, tgt_out = self.task.train_batch()
        with self.autocast:
            logits = self.train_model(src, tgt_in)
            loss = self.task.loss(logits, tgt_out)
            if t.z_loss > 0:
                loss = loss + t.z_loss * z_loss(logits, self.task.predicted(tgt_out))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        lr = self.sched.get_last_lr()[0]
        self.pending.append((step, lr, loss.detach()))
        if self.must_sync(step) and self.diverged():
            return False
        probing = self.is_probe_step(step)
        grads = self.probe.grad_norms() if probing else None
        if t.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
        if probing:
            self.probe.snapshot()
        if probing and self.weights is not None:
            self.weights.snapshot()
        self.opt.step()
        self.sched.step()
        self.steps_done = step
        row = None
        if grads is not None or self.is_eval_step(step):
            row = self.record(step, lr, result["last_loss"], grads, weights_moved=probing)
        self.progress.update(step, result["last_loss"] if not self.pending else None,
                             row.get("model_update") if row else None)
        return True

    def diverged(self) -> bool:
        """Read the losses of the steps since the last read (one host sync) and check them in
        order: the first that is not finite or above the explosion threshold ends the run, with
        its row; that step is not applied (steps after it, taken before the read, are void)."""
        if not self.pending:
            return False
        steps, lrs, losses = zip(*self.pending)
        self.pending = []
        result = self.result
        for step, lr, loss_value in zip(steps, lrs, torch.stack(losses).float().tolist()):
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

    def record(self, step: int, lr, loss, grads, at_init: Optional[Dict] = None,
               weights_moved: bool = False) -> Dict:
        """Write the metrics row (and, with probes on, the layers rows) for `step`.
        `weights_moved`: the weight probe holds the weights from before this step."""
        row = {"step": step, "lr": lr, "loss": loss}
        if self.probe is not None:
            feats, ln_norms, max_logits = self.probe.probe_pass(self.probe_src, self.probe_tgt_in)
            update = model_update(feats, self.features_init, self.probe_tokens)
            with torch.no_grad():
                log_z = log_z_stats(self.model.logits(feats), self.probe_tokens)
            total, per_sublayer = grads if grads is not None else self.probe.grad_norms()
            relative = (self.probe.relative_updates() if weights_moved
                        else torch.full_like(per_sublayer, float("nan")))
            n = per_sublayer.numel()
            values = torch.cat([torch.stack([total.float(), update.float()]), log_z.float(),
                                per_sublayer.float(), ln_norms.float(), max_logits.float(),
                                relative.float()]).tolist()  # one host sync
            row.update(grad_norm=values[0], model_update=values[1], log_z_mean=values[2], log_z_max=values[3])
            per = [values[4 + k * n: 4 + (k + 1) * n] for k in range(4)]
            rows = rows_for_layers(step, self.probe.keys, *per)
            if at_init is not None:
                row.update(grad_norm=at_init["grad_norm"], output_change=at_init["output_change"])
                for r, g, c, w2 in zip(rows, at_init["sublayer_grad_norm"], at_init["input_change"],
                                       at_init["w2_grad_norm"]):
                    r.update(grad_norm=g, input_change=c, w2_grad_norm=w2)
            if self.weights is not None:
                rows += self._weight_rows(step, lr if lr is not None else self.sched.get_last_lr()[0],
                                          weights_moved)
            self.layers.write(rows)
        if self.is_eval_step(step):
            row.update(self.task.evaluate(self.model, step))
            result = self.result
            best = result["best_eval_loss"]
            if math.isfinite(row["eval_loss"]) and (best is None or row["eval_loss"] < best):
                result["best_eval_loss"] = row["eval_loss"]
            result.update(final_eval_loss=row["eval_loss"], final_eval_acc=row["eval_acc"])
            self.task.summarise_eval(row, result)
        row["elapsed_s"] = time.perf_counter() - self.start
        self.metrics.write([row])
        return row

    def _weight_rows(self, step: int, lr: float, moved: bool):
        norms, angles, row_angles, grads = self.weights.measure().tolist()  # one host sync
        nan = float("nan")
        return [{"step": step, "stack": stack, "layer": layer, "sublayer": sublayer, "param": param,
                 "grad_norm": g if moved else nan, "weight_norm": n,
                 "angular_update": a if moved else nan, "row_angular_update": r if moved else nan,
                 "effective_lr": theory.effective_lr(self.optim_name, lr, n), "scale_invariant": inv,
                 "elements": w.numel()}
                for (stack, layer, sublayer, param), w, n, a, r, g, inv
                in zip(self.weights.keys, self.weights.weights, norms, angles, row_angles, grads,
                       self.scale_invariant)]

    def close(self) -> None:
        self.metrics.close()
        self.layers.close()
        self.progress.close()


def _train(cfg: DictConfig, out_dir: Path, summary: Dict, start: float, task: Task,
           state: Optional[Dict] = None) -> Dict:
    """The loop: steps, with a checkpoint every train.checkpoint_every steps and when the
    process is asked to stop (then RunStopped); then what the task measures at the end."""
    run = Run(cfg, out_dir, summary, start, task, state=state)
    stop = StopRequests()
    try:
        with stop:
            for step in range(run.steps_done + 1, cfg.train.steps + 1):
                if not run.step(step):
                    break
                if stop.received is not None:
                    if run.diverged():
                        break
                    run.save_checkpoint()
                    summary.update(status="interrupted",
                                   interrupted_by=signal_name(stop.received),
                                   wall_seconds=time.perf_counter() - run.start)
                    write_json(Path(out_dir) / SUMMARY, summary)
                    log.warning("stopped by %s after step %d: checkpoint written, the same command resumes it",
                                signal_name(stop.received), step)
                    stop.pass_on()
                if run.is_checkpoint_step(step):
                    run.save_checkpoint()
            run.diverged()
    finally:
        run.close()
    wall = time.perf_counter() - run.start
    run.result.update(steps_done=run.steps_done, wall_seconds=wall,
                      steps_per_second=run.steps_done / wall if wall > 0 else None,
                      target_tokens=task.target_tokens)
    for key in ("checkpoint_step", "interrupted_by"):
        summary.pop(key, None)
    if run.result["status"] == "completed" and run.steps_done > 0:
        finish_start = time.perf_counter()
        final = task.finish(run.model, out_dir)
        if final:  # e.g. the test decoding, timed apart from the training
            run.result.update(final, finish_seconds=time.perf_counter() - finish_start)
    return run.result


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


class _Progress:
    """tqdm bar on a terminal; otherwise a log line every probe.log_every steps."""

    def __init__(self, cfg: DictConfig, enabled: bool = True):
        self.cfg, self.every, self.last_update = cfg, cfg.probe.log_every, float("nan")
        self.enabled, self.bar = enabled, None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.train.steps, desc=f"{group_name(cfg)} L{cfg.depth}",
                            leave=True)

    def resume_at(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step)

    def update(self, step: int, loss: Optional[float], update: Optional[float]) -> None:
        """`loss`: None at the steps whose loss the host has not read (GPU, Run.must_sync)."""
        if update is not None:
            self.last_update = update
        if self.bar is not None:
            self.bar.update(1)
            if update is not None and loss is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}", model_update=f"{self.last_update:.3g}")
        elif self.enabled and loss is not None and (step % self.every == 0 or step == self.cfg.train.steps):
            probed = f" model_update {self.last_update:.4g}" if math.isfinite(self.last_update) else ""
            log.info("%s L%d step %d/%d loss %.4f%s", group_name(self.cfg), self.cfg.depth, step,
                     self.cfg.train.steps, loss, probed)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
