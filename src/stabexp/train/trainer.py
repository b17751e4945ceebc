"""train(cfg, out_dir): one run, start to finish, writing its tidy files into out_dir.

Files (all in out_dir):
- config.yaml: the resolved config.
- metrics.csv: one row per probe step (step 0 = at init, then every step up to
  probe.first_steps, every probe.every steps, every eval step and the last step).
- layers.csv: one row per (probe step, stack, layer, sublayer).
- summary.json: status (running | completed | diverged | interrupted | failed), losses, timing,
  resolved constants, what the task says about its data; after a completed run, what the task
  measures at the end (translation: test BLEU, with test_translations.tsv).

The trainer asks the task (data/) for batches, the loss and the eval columns, and the model for
its outputs and residual sublayers; it knows neither's insides.

Row at step i: `loss`, `grad_norm` and `lr` belong to optimiser step i (computed on theta_{i-1});
`model_update`, `ln_input_norm` and the eval columns are measured on theta_i, after the step.
With probe.weights a row per weight matrix and probe step holds its norm ||w_i||, the angular
update of step i (theta_{i-1} to theta_i, whole matrix and mean over rows), the effective lr
lr_i / ||w_i||^2 and whether the weight is scale-invariant in this model (probes/weights.py).
With probe.at_init the step-0 rows also hold the at-init probes (probes/at_init.py):
`output_change` (metrics) and `input_change` (layers) from Admin's perturbation, and
`grad_norm` / `w2_grad_norm` of one backward pass at theta_0 on a batch of the init stream.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from stabexp import theory
from stabexp.config import validate
from stabexp.data import Task, make_task
from stabexp.model import build_model, initialise
from stabexp.probes import LayerProbe, model_update, rows_for_layers
from stabexp.probes.at_init import grad_at_init, mean_of, output_change
from stabexp.probes.weights import WeightProbe, scale_invariance
from stabexp.train.optim import build_optimizer
from stabexp.train.schedule import lr_factor

log = logging.getLogger("stabexp")

def metrics_columns(eval_columns) -> list:
    """metrics.csv's header: the step's own columns, then the task's eval columns."""
    return ["step", "lr", "loss", "grad_norm", "model_update", "output_change", *eval_columns, "elapsed_s"]


METRICS_COLUMNS = metrics_columns(Task.eval_columns)  # the synthetic tasks' (translation adds eval_ppl, valid_bleu)
# A row is a residual sublayer (param empty) or, with probe.weights, one weight matrix (param set).
LAYERS_COLUMNS = ["step", "stack", "layer", "sublayer", "param", "grad_norm", "ln_input_norm",
                  "input_change", "w2_grad_norm", "weight_norm", "angular_update",
                  "row_angular_update", "effective_lr", "scale_invariant", "elements"]
FINISHED = ("completed", "diverged")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _write_json(path: Path, data: Dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float) + "\n")
    os.replace(tmp, path)


def read_summary(out_dir: Path) -> Optional[Dict]:
    path = Path(out_dir) / "summary.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


class _CsvLog:
    """Append-only CSV writer, flushed per write so an interrupted run keeps its rows."""

    def __init__(self, path: Path, columns):
        self.file = open(path, "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=columns)
        self.writer.writeheader()

    def write(self, rows) -> None:
        self.writer.writerows(rows)
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def group_name(cfg: DictConfig) -> str:
    """A group is a residual placement of the Transformer; NormMLP has none: it goes by its name."""
    return cfg.group.name if cfg.model.arch == "transformer" else cfg.model.arch


def train(cfg: DictConfig, out_dir) -> Dict:
    """Run one experiment; return its summary (also written to out_dir/summary.json).

    A run that is already finished in out_dir is left untouched unless cfg.overwrite is set.
    The task is built first, so bad data (a ConfigError) stops the run before anything is
    written. A diverged run is a result (status "diverged"); an unexpected error during the run
    is recorded as status "failed" and re-raised.
    """
    validate(cfg)
    out_dir = Path(out_dir)
    previous = read_summary(out_dir)
    if previous and previous.get("status") in FINISHED and not cfg.overwrite:
        log.info("already %s, left as is: %s (overwrite=true runs it again)", previous["status"], out_dir)
        return previous
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    task = make_task(cfg, _device(cfg.train.device))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    summary = {"status": "running", "experiment": cfg.experiment or None, "scale": cfg.scale,
               "group": group_name(cfg), "depth": cfg.depth,
               "decoder_depth": cfg.decoder_depth if cfg.decoder_depth is not None else cfg.depth,
               "seed": cfg.seed, "model": cfg.model.name, "d_model": cfg.model.d_model,
               "task": cfg.task.name,
               "steps": cfg.train.steps, "out_dir": str(out_dir)}
    start = time.perf_counter()
    try:
        summary.update(_train(cfg, out_dir, summary, start, task))
    except KeyboardInterrupt:
        summary.update(status="interrupted", wall_seconds=time.perf_counter() - start)
        _write_json(out_dir / "summary.json", summary)
        raise
    except Exception as err:
        summary.update(status="failed", error=f"{type(err).__name__}: {err}",
                       wall_seconds=time.perf_counter() - start)
        (out_dir / "error.txt").write_text(traceback.format_exc())
        _write_json(out_dir / "summary.json", summary)
        raise
    _write_json(out_dir / "summary.json", summary)
    return summary


class Run:
    """One run's live state: model, optimiser, data, probes and open files.

    train() drives it; the benchmark (bench.py) times `Run.step` itself, so both measure the
    same code path.
    """

    def __init__(self, cfg: DictConfig, out_dir: Path, summary: Dict, start: float, task: Task,
                 show_progress: bool = True):
        t = self.train_cfg = cfg.train
        self.cfg, self.start, self.task = cfg, start, task
        if t.threads:
            torch.set_num_threads(t.threads)
        self.device = device = _device(t.device)
        torch.manual_seed(cfg.seed)
        self.probe_src, self.probe_tgt_in, _ = task.probe_batch()

        self.model = model = build_model(cfg, task.vocab_size, task.pad_id, task.max_positions).to(device)
        self.probe_tokens = model.feature_mask(self.probe_src, self.probe_tgt_in)
        summary["constants"] = initialise(model, cfg.group.init, task.init_batch)
        summary["chance_loss"] = task.chance_loss
        summary.update(task.info())
        o = cfg.optim
        summary["optim"] = {"name": o.name, "lr": t.lr, "weight_decay": o.weight_decay,
                            "momentum": o.momentum, "beta1": o.betas[0], "decay_on": o.decay_on}
        if o.weight_decay > 0:
            summary["theory"] = theory.equilibrium(o.name, t.lr, o.weight_decay, o.momentum, o.betas[0])
        _write_json(out_dir / "summary.json", summary)  # status "running": visible while it trains

        self.opt = build_optimizer(cfg, model, device)
        schedule = cfg.group.schedule if t.schedule == "group" else t.schedule
        init_factor = None if t.warmup_init_lr is None else t.warmup_init_lr / t.lr
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda i: lr_factor(schedule, i + 1, t.warmup_steps, init_factor))
        self.probe = LayerProbe(model) if cfg.probe.enabled else None
        self.weights = WeightProbe(model) if cfg.probe.enabled and cfg.probe.weights else None
        if self.weights is not None:
            self.scale_invariant = scale_invariance(model, lambda: model(self.probe_src, self.probe_tgt_in))
            if "theory" in summary:
                # Defined by the hyper-parameters alone only for AdamW (SGD's needs the gradients).
                norms = {".".join(map(str, key)): theory.equilibrium_norm(o.name, t.lr, o.weight_decay, o.momentum,
                                                                          elements=w.numel())
                         for key, w in zip(self.weights.keys, self.weights.weights)}
                summary["theory"]["equilibrium_norm"] = norms if any(norms.values()) else None
                _write_json(out_dir / "summary.json", summary)
        # Exploding = above explode_factor times the larger of the chance loss and the first
        # loss (the first loss can sit far above chance: tied embeddings, strong identity path).
        self.explode_at = float("inf")
        self.metrics = _CsvLog(out_dir / "metrics.csv", metrics_columns(task.eval_columns))
        self.layers = _CsvLog(out_dir / "layers.csv", LAYERS_COLUMNS)
        self.progress = _Progress(cfg, show_progress)
        self.steps_done = 0
        self.result = {"status": "completed", "diverged_at_step": None, "first_loss": None,
                       "last_loss": None, "best_eval_loss": None, "final_eval_loss": None,
                       "final_eval_acc": None}
        self.features_init = None
        if self.probe is not None:
            with torch.no_grad():
                model.eval()
                self.features_init = model.features(self.probe_src, self.probe_tgt_in).clone()
        model.train()
        self.record(0, None, None, None, at_init=self.probe_at_init() if cfg.probe.at_init else None)

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

    def is_eval_step(self, step: int) -> bool:
        # A run of 0 steps measures at init only (probe.at_init): scoring a validation split
        # with a 100-layer d = 512 model would cost more than the probes.
        t = self.train_cfg
        return t.steps > 0 and (step % t.eval_every == 0 or step == t.steps)

    def is_probe_step(self, step: int) -> bool:
        p = self.cfg.probe
        return p.enabled and (step <= p.first_steps or step % p.every == 0 or self.is_eval_step(step))

    def step(self, step: int) -> bool:
        """Optimiser step number `step` (1-based), probing if due; False when it diverged."""
        t, model, result = self.train_cfg, self.model, self.result
        src, tgt_in, tgt_out = self.task.train_batch()
        loss = self.task.loss(model(src, tgt_in), tgt_out)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        loss_value = loss.item()
        lr = self.sched.get_last_lr()[0]
        if result["first_loss"] is None:
            result["first_loss"] = loss_value
            if math.isfinite(loss_value):
                self.explode_at = t.explode_factor * max(self.task.chance_loss, loss_value)
        result["last_loss"] = loss_value
        if not math.isfinite(loss_value) or loss_value > self.explode_at:
            # Diverged: keep this step's loss as the last row; the step is not applied.
            result.update(status="diverged", diverged_at_step=step)
            self.metrics.write([{"step": step, "lr": lr, "loss": loss_value,
                                 "elapsed_s": time.perf_counter() - self.start}])
            log.warning("diverged at step %d (loss %s)", step, loss_value)
            return False
        probing = self.is_probe_step(step)
        grads = self.probe.grad_norms() if probing else None
        if t.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
        if probing and self.weights is not None:
            self.weights.snapshot()
        self.opt.step()
        self.sched.step()
        self.steps_done = step
        row = None
        if grads is not None or self.is_eval_step(step):
            row = self.record(step, lr, loss_value, grads, weights_moved=probing)
        self.progress.update(step, loss_value, row.get("model_update") if row else None)
        return True

    def record(self, step: int, lr, loss, grads, at_init: Optional[Dict] = None,
               weights_moved: bool = False) -> Dict:
        """Write the metrics row (and, with probes on, the layers rows) for `step`.
        `weights_moved`: the weight probe holds the weights from before this step."""
        row = {"step": step, "lr": lr, "loss": loss}
        if self.probe is not None:
            feats, ln_norms = self.probe.features_with_ln_norms(self.probe_src, self.probe_tgt_in)
            update = model_update(feats, self.features_init, self.probe_tokens)
            total, per_sublayer = grads if grads is not None else self.probe.grad_norms()
            n = per_sublayer.numel()
            values = torch.cat([torch.stack([total.float(), update.float()]),
                                per_sublayer.float(), ln_norms.float()]).tolist()  # one host sync
            row.update(grad_norm=values[0], model_update=values[1])
            rows = rows_for_layers(step, self.probe.keys, values[2:2 + n], values[2 + n:])
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
                 "effective_lr": theory.effective_lr(self.cfg.optim.name, lr, n), "scale_invariant": inv,
                 "elements": w.numel()}
                for (stack, layer, sublayer, param), w, n, a, r, g, inv
                in zip(self.weights.keys, self.weights.weights, norms, angles, row_angles, grads,
                       self.scale_invariant)]

    def close(self) -> None:
        self.metrics.close()
        self.layers.close()
        self.progress.close()


def _train(cfg: DictConfig, out_dir: Path, summary: Dict, start: float, task: Task) -> Dict:
    run = Run(cfg, out_dir, summary, start, task)
    try:
        for step in range(1, cfg.train.steps + 1):
            if not run.step(step):
                break
    finally:
        run.close()
    wall = time.perf_counter() - start
    run.result.update(steps_done=run.steps_done, wall_seconds=wall,
                      steps_per_second=run.steps_done / wall if wall > 0 else None,
                      target_tokens=task.target_tokens)
    if run.result["status"] == "completed" and run.steps_done > 0:
        final = task.finish(run.model, out_dir)
        if final:  # e.g. the test decoding, timed apart from the training
            run.result.update(final, finish_seconds=time.perf_counter() - start - wall)
    return run.result


class _Progress:
    """tqdm bar on a terminal; otherwise a log line every probe.log_every steps."""

    def __init__(self, cfg: DictConfig, enabled: bool = True):
        self.cfg, self.every, self.last_update = cfg, cfg.probe.log_every, float("nan")
        self.enabled, self.bar = enabled, None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.train.steps, desc=f"{group_name(cfg)} L{cfg.depth}",
                            leave=True)

    def update(self, step: int, loss: float, update: Optional[float]) -> None:
        if update is not None:
            self.last_update = update
        if self.bar is not None:
            self.bar.update(1)
            if update is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}", model_update=f"{self.last_update:.3g}")
        elif self.enabled and (step % self.every == 0 or step == self.cfg.train.steps):
            probed = f" model_update {self.last_update:.4g}" if math.isfinite(self.last_update) else ""
            log.info("%s L%d step %d/%d loss %.4f%s", group_name(self.cfg), self.cfg.depth, step,
                     self.cfg.train.steps, loss, probed)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
