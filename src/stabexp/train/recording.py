"""What a run records at a probe or eval step: the metrics row and the layers rows, and the
progress line. The columns are documented in docs/outputs.md.

Row at step i: `loss` (the training loss, z-loss included), `grad_norm` and `lr` belong to
optimiser step i (computed on theta_{i-1}); `model_update`, `ln_input_norm`, the output log Z
(`log_z_mean`, `log_z_max`), the largest attention logit (`max_attn_logit`, layers rows) and the
eval columns are measured on theta_i, after the step; `relative_update` (layers rows) is step
i's update of each sublayer relative to its weights after it. With probe.weights a row per
weight matrix holds its norm, the angular update of step i, the effective lr and whether the
weight is scale-invariant (probes/weights.py). With probe.at_init the step-0 rows also hold
Admin's output change and the gradient at theta_0 (probes/at_init.py). With probe.dependency,
dependency.csv holds the residual dependency at step 0 and at the last step
(probes/dependency.py), and with probe.layer_importance layer_importance.csv the eval-loss
increase of skipping each layer, at the same two steps (probes/layer_importance.py). With probe.update_bound, update_bound.csv holds DeepNet's bound on the
model update term by term at every probe step (probes/update_bound.py).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Dict, List, Optional

import torch
from omegaconf import DictConfig

from stabexp import theory
from stabexp.terminal import duration
from stabexp.data import Task
from stabexp.probes import log_z_stats, model_update, rows_for_layers
from stabexp.probes.dependency import dependency
from stabexp.probes.layer_importance import layer_importance
from stabexp.train.files import DEPENDENCY, LAYER_IMPORTANCE, read_csv_rows, write_csv

log = logging.getLogger("stabexp")


def metrics_columns(eval_columns) -> list:
    """metrics.csv's header: the step's own columns, then the task's eval columns."""
    return ["step", "lr", "loss", "grad_norm", "model_update", "output_change", "log_z_mean", "log_z_max",
            *eval_columns, "elapsed_s"]


METRICS_COLUMNS = metrics_columns(Task.eval_columns)  # the synthetic tasks' (translation adds eval_ppl, valid_bleu)
# A row is a residual sublayer (param empty) or, with probe.weights, one weight matrix (param set).
LAYERS_COLUMNS = ["step", "stack", "layer", "sublayer", "param", "grad_norm", "ln_input_norm", "stream_norm",
                  "max_attn_logit", "relative_update", "input_change", "w2_grad_norm", "output_grad_norm",
                  "weight_norm", "angular_update", "row_angular_update", "effective_lr", "scale_invariant", "elements"]


def to_host(**tensors: torch.Tensor) -> Dict[str, List[float]]:
    """Every tensor as a list of floats, by name, from one device-to-host transfer."""
    flat = {name: t.float().reshape(-1) for name, t in tensors.items()}
    values = torch.cat(list(flat.values())).tolist()
    out, start = {}, 0
    for name, t in flat.items():
        out[name], start = values[start:start + t.numel()], start + t.numel()
    return out


def record(run, step: int, lr, loss, grads, at_init: Optional[Dict] = None, weights_moved: bool = False) -> Dict:
    """Write the metrics row (and, with probes on, the layers rows) of `step` for a Run.
    `grads`: (total, per sublayer) gradient norms of this step, None to take them now;
    `weights_moved`: the weight probe holds the weights from before this step."""
    row = {"step": step, "lr": lr, "loss": loss}
    if run.probe is not None:
        feats, ln_norms, max_logits, stream_norms = run.probe.probe_pass(run.probe_src, run.probe_tgt_in)
        with torch.no_grad():
            log_z = log_z_stats(run.model.logits(feats), run.probe_tokens)
        total, per_sublayer = grads if grads is not None else run.probe.grad_norms()
        relative = (run.probe.relative_updates() if weights_moved
                    else torch.full_like(per_sublayer, float("nan")))
        host = to_host(total=total, update=model_update(feats, run.features_init, run.probe_tokens),
                       log_z=log_z, grad=per_sublayer, ln=ln_norms, logit=max_logits, relative=relative,
                       stream=stream_norms)
        (grad_norm,), (update,), (log_z_mean, log_z_max) = host["total"], host["update"], host["log_z"]
        row.update(grad_norm=grad_norm, model_update=update, log_z_mean=log_z_mean, log_z_max=log_z_max)
        rows = rows_for_layers(step, run.probe.keys, host["grad"], host["ln"], host["logit"], host["relative"],
                               host["stream"])
        if at_init is not None:
            row.update(grad_norm=at_init["grad_norm"], output_change=at_init["output_change"])
            for r, g, c, w2, out in zip(rows, at_init["sublayer_grad_norm"], at_init["input_change"],
                                        at_init["w2_grad_norm"], at_init["output_grad_norm"]):
                r.update(grad_norm=g, input_change=c, w2_grad_norm=w2, output_grad_norm=out)
        if run.weights is not None:
            rows += weight_rows(run, step, lr if lr is not None else run.sched.get_last_lr()[0], weights_moved)
        run.layers.write(rows)
        if run.bound is not None:
            run.bound_log.write(run.bound.rows(step))
    if run.is_eval_step(step):
        row.update(run.task.evaluate(run.model, step))
        result = run.result
        best = result["best_eval_loss"]
        if math.isfinite(row["eval_loss"]) and (best is None or row["eval_loss"] < best):
            result["best_eval_loss"] = row["eval_loss"]
        result.update(final_eval_loss=row["eval_loss"], final_eval_acc=row["eval_acc"])
        run.task.summarise_eval(row, result)
    row["elapsed_s"] = time.perf_counter() - run.start
    run.metrics.write([row])
    return row


DEPENDENCY_COLUMNS = ["step", "stack", "sublayer", "component", "beta"]


def record_dependency(run, step: int) -> None:
    """probe.dependency: the residual dependency of every sublayer on the probe batch at `step`
    (probes/dependency.py), written beside the step-0 rows (the file holds init and end only, so
    a resumed run that rewrites the end leaves the same file)."""
    path = run.out_dir / DEPENDENCY
    kept = [] if step == 0 else [r for r in read_csv_rows(path) if r["step"] == "0"]
    rows = [{"step": step, **r} for r in dependency(run.model, run.probe_src, run.probe_tgt_in)]
    write_csv(path, DEPENDENCY_COLUMNS, kept + rows)


LAYER_IMPORTANCE_COLUMNS = ["step", "stack", "layer", "eval_loss", "full_eval_loss", "loss_increase"]


def record_layer_importance(run, step: int) -> None:
    """probe.layer_importance: the eval-loss increase of skipping each layer at `step`
    (probes/layer_importance.py), beside the step-0 rows, as record_dependency."""
    path = run.out_dir / LAYER_IMPORTANCE
    kept = [] if step == 0 else [r for r in read_csv_rows(path) if r["step"] == "0"]
    rows = [{"step": step, **r} for r in layer_importance(run.model, run.task.eval_loss)]
    write_csv(path, LAYER_IMPORTANCE_COLUMNS, kept + rows)


def weight_rows(run, step: int, lr: float, moved: bool) -> List[Dict]:
    """One layers row per weight matrix (probe.weights); the step's own columns are empty
    where the weights did not move in it."""
    norms, angles, row_angles, grads = run.weights.measure().tolist()  # one host sync
    nan = float("nan")
    return [{"step": step, "stack": stack, "layer": layer, "sublayer": sublayer, "param": param,
             "grad_norm": g if moved else nan, "weight_norm": n,
             "angular_update": a if moved else nan, "row_angular_update": r if moved else nan,
             "effective_lr": theory.effective_lr(run.optim_name, lr, n), "scale_invariant": inv,
             "elements": w.numel()}
            for (stack, layer, sublayer, param), w, n, a, r, g, inv
            in zip(run.weights.keys, run.weights.weights, norms, angles, row_angles, grads, run.scale_invariant)]


def group_name(cfg: DictConfig) -> str:
    """A group is a residual placement of the Transformer; NormMLP has none: it goes by its name."""
    return cfg.model.arch if cfg.model.arch == "normmlp" else cfg.group.name


class Progress:
    """How far a run is, from its first step: on a terminal a tqdm bar (steps/s, time left,
    the loss and model update at probe steps); otherwise a log line at the first step, then
    every probe.log_every steps and at least every LINE_SECONDS, each with steps/s and the time
    left, so a log shows a run is moving without a line per step."""

    LINE_SECONDS = 30.0

    def __init__(self, cfg: DictConfig, enabled: bool = True):
        self.cfg, self.every, self.last_update = cfg, cfg.probe.log_every, float("nan")
        self.enabled, self.bar = enabled, None
        self.use_bar = enabled and sys.stderr.isatty()
        self.first_step = None  # the first step this process runs; `started`: when it had run
        self.started = self.last_line = 0.0

    def _start(self, step: int) -> None:
        """The first step of this process (a resumed run's steps before it are not in the rate)."""
        self.first_step, self.started = step, time.perf_counter()
        self.last_line = self.started
        if self.use_bar:
            from tqdm import tqdm

            # The first step is done when the bar starts: it counts from there (as the lines' pace).
            self.bar = tqdm(total=self.cfg.train.steps, initial=step, unit="step", leave=True,
                            desc=f"{group_name(self.cfg)} L{self.cfg.depth}", dynamic_ncols=True)

    def update(self, step: int, loss: Optional[float], update: Optional[float]) -> None:
        """`loss`: None at the steps whose loss the host has not read (GPU, Run.must_sync)."""
        if not self.enabled:
            return
        first = self.first_step is None
        if first:
            self._start(step)
        if update is not None:
            self.last_update = update
        if self.bar is not None:
            if not first:
                self.bar.update(1)
            if update is not None and loss is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}", model_update=f"{self.last_update:.3g}")
            return
        now, total = time.perf_counter(), self.cfg.train.steps
        on_schedule = loss is not None and (step % self.every == 0 or step == total or step == self.first_step)
        if on_schedule or now - self.last_line >= self.LINE_SECONDS:
            self.last_line = now
            done, seconds = step - self.first_step, now - self.started  # `started`: the first step's end
            pace = ""
            if step > self.first_step and seconds > 0:
                rate = done / seconds
                pace = f", {rate:.3g} steps/s" + (f", {duration((total - step) / rate)} left" if step < total else "")
            said = f" loss {loss:.4f}" if loss is not None else ""
            probed = f" model_update {self.last_update:.4g}" if math.isfinite(self.last_update) else ""
            log.info("%s L%d step %d/%d%s%s%s", group_name(self.cfg), self.cfg.depth, step, total, said, probed, pace)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
