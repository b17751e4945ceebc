"""train(cfg, out_dir): one run, start to finish, writing its tidy files into out_dir.

Files (all in out_dir):
- config.yaml: the resolved config.
- metrics.csv: one row per probe step (step 0 = at init, then every step up to
  probe.first_steps, every probe.every steps, every eval step and the last step).
- layers.csv: one row per (probe step, stack, layer, sublayer).
- summary.json: status (running | completed | diverged | interrupted | failed), losses, timing,
  resolved constants.

Row at step i: `loss`, `grad_norm` and `lr` belong to optimiser step i (computed on theta_{i-1});
`model_update`, `ln_input_norm` and the eval columns are measured on theta_i, after the step.
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
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from stabexp.config import validate
from stabexp.data import TASKS
from stabexp.model import build_model, initialise
from stabexp.probes import LayerProbe, model_update, rows_for_layers
from stabexp.train.schedule import lr_factor

log = logging.getLogger("stabexp")

METRICS_COLUMNS = ["step", "lr", "loss", "grad_norm", "model_update", "eval_loss", "eval_acc", "elapsed_s"]
LAYERS_COLUMNS = ["step", "stack", "layer", "sublayer", "grad_norm", "ln_input_norm"]
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


@torch.no_grad()
def evaluate(model, batch) -> Dict[str, float]:
    """Teacher-forced loss and token accuracy on a fixed held-out batch."""
    src, tgt_in, tgt_out = batch
    was_training = model.training
    model.eval()
    logits = model(src, tgt_in)
    model.train(was_training)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())
    acc = (logits.argmax(-1) == tgt_out).float().mean()
    loss, acc = torch.stack([loss, acc]).tolist()
    return {"eval_loss": loss, "eval_acc": acc}


def train(cfg: DictConfig, out_dir) -> Dict:
    """Run one experiment; return its summary (also written to out_dir/summary.json).

    A run that is already finished in out_dir is left untouched unless cfg.overwrite is set.
    A diverged run is a result (status "diverged"); an unexpected error is recorded as status
    "failed" and re-raised.
    """
    validate(cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = read_summary(out_dir)
    if previous and previous.get("status") in FINISHED and not cfg.overwrite:
        log.info("already %s, left as is: %s (overwrite=true runs it again)", previous["status"], out_dir)
        return previous
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    summary = {"status": "running", "group": cfg.group.name, "depth": cfg.depth,
               "decoder_depth": cfg.decoder_depth if cfg.decoder_depth is not None else cfg.depth,
               "seed": cfg.seed, "model": cfg.model.name, "task": cfg.task.name,
               "steps": cfg.train.steps, "out_dir": str(out_dir)}
    start = time.perf_counter()
    try:
        summary.update(_train(cfg, out_dir, summary, start))
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


def _probe_steps(cfg: DictConfig):
    p, t = cfg.probe, cfg.train
    return lambda step: (step <= p.first_steps or step % p.every == 0 or step % t.eval_every == 0
                         or step == t.steps)


def _train(cfg: DictConfig, out_dir: Path, summary: Dict, start: float) -> Dict:
    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    device = _device(t.device)
    torch.manual_seed(cfg.seed)
    task = TASKS[cfg.task.name](cfg.task.vocab_size, cfg.task.seq_len, cfg.seed, device)
    eval_batch = task.eval_batch(cfg.task.eval_batch_size)
    probe_src, probe_tgt_in, _ = task.probe_batch(cfg.task.probe_batch_size)

    model = build_model(cfg, cfg.task.vocab_size).to(device)
    constants = initialise(model, cfg.group.init, lambda: task.init_batch(t.batch_size))
    summary["constants"] = constants
    summary["chance_loss"] = task.chance_loss
    _write_json(out_dir / "summary.json", summary)  # status "running": visible while it trains

    opt = torch.optim.Adam(model.parameters(), lr=t.lr, betas=tuple(cfg.optim.betas),
                           eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: lr_factor(cfg.group.schedule, i + 1, t.warmup_steps))
    probe = LayerProbe(model)
    is_probe_step = _probe_steps(cfg)
    # Exploding = above explode_factor times the larger of the chance loss and the first loss
    # (the first loss can sit far above chance: tied embeddings with a strong identity path).
    explode_at = float("inf")

    metrics = _CsvLog(out_dir / "metrics.csv", METRICS_COLUMNS)
    layers = _CsvLog(out_dir / "layers.csv", LAYERS_COLUMNS)
    progress = _Progress(cfg)
    result = {"status": "completed", "diverged_at_step": None, "first_loss": None, "last_loss": None,
              "best_eval_loss": None, "final_eval_loss": None, "final_eval_acc": None}

    def record(step: int, lr, loss, grads) -> Dict:
        feats, ln_norms = probe.features_with_ln_norms(probe_src, probe_tgt_in)
        update = model_update(feats, features_init) if step > 0 else torch.zeros((), device=device)
        total, per_sublayer = grads
        n = per_sublayer.numel()
        values = torch.cat([torch.stack([total.float(), update.float()]),
                            per_sublayer.float(), ln_norms.float()]).tolist()  # the one host sync
        row = {"step": step, "lr": lr, "loss": loss, "grad_norm": values[0], "model_update": values[1],
               "eval_loss": None, "eval_acc": None}
        if step % t.eval_every == 0 or step == t.steps:
            row.update(evaluate(model, eval_batch))
            best = result["best_eval_loss"]
            if math.isfinite(row["eval_loss"]) and (best is None or row["eval_loss"] < best):
                result["best_eval_loss"] = row["eval_loss"]
            result["final_eval_loss"], result["final_eval_acc"] = row["eval_loss"], row["eval_acc"]
        row["elapsed_s"] = time.perf_counter() - start
        metrics.write([row])
        layers.write(rows_for_layers(step, probe.keys, values[2:2 + n], values[2 + n:]))
        return row

    steps_done = 0
    try:
        with torch.no_grad():
            model.eval()
            features_init = model.features(probe_src, probe_tgt_in).clone()
            model.train()
        record(0, None, None, probe.grad_norms())
        for step in range(1, t.steps + 1):
            src, tgt_in, tgt_out = task.train_batch(t.batch_size)
            logits = model(src, tgt_in)
            loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            loss_value = loss.item()
            lr = sched.get_last_lr()[0]
            if result["first_loss"] is None:
                result["first_loss"] = loss_value
                if math.isfinite(loss_value):
                    explode_at = t.explode_factor * max(task.chance_loss, loss_value)
            result["last_loss"] = loss_value
            if not math.isfinite(loss_value) or loss_value > explode_at:
                # Diverged: keep this step's loss as the last row; the step is not applied.
                result.update(status="diverged", diverged_at_step=step)
                metrics.write([{"step": step, "lr": lr, "loss": loss_value,
                                "elapsed_s": time.perf_counter() - start}])
                log.warning("diverged at step %d (loss %s)", step, loss_value)
                break
            grads = probe.grad_norms() if is_probe_step(step) else None
            if t.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
            opt.step()
            sched.step()
            steps_done = step
            if grads is not None:
                row = record(step, lr, loss_value, grads)
                progress.update(step, loss_value, row["model_update"])
            else:
                progress.update(step, loss_value, None)
    finally:
        metrics.close()
        layers.close()
        progress.close()
    wall = time.perf_counter() - start
    result.update(steps_done=steps_done, wall_seconds=wall,
                  steps_per_second=steps_done / wall if wall > 0 else None)
    return result


class _Progress:
    """tqdm bar on a terminal; otherwise a log line every probe.log_every steps."""

    def __init__(self, cfg: DictConfig):
        self.cfg, self.every, self.last_update = cfg, cfg.probe.log_every, float("nan")
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.train.steps, desc=f"{cfg.group.name} L{cfg.depth}",
                            leave=True)

    def update(self, step: int, loss: float, update: Optional[float]) -> None:
        if update is not None:
            self.last_update = update
        if self.bar is not None:
            self.bar.update(1)
            if update is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}", model_update=f"{self.last_update:.3g}")
        elif step % self.every == 0 or step == self.cfg.train.steps:
            log.info("%s L%d step %d/%d loss %.4f model_update %.4g", self.cfg.group.name,
                     self.cfg.depth, step, self.cfg.train.steps, loss, self.last_update)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
