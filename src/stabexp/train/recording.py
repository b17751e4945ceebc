"""What a run writes at a step: the metrics row, the layers rows and each probe's own file
(`Recorder`, from the probes' Rows: stabexp.probes.base), and the progress line (`Progress`).
The columns are documented in docs/outputs.md, each probe's measure in its module under probes/.

Row at step i: `loss` (the training loss, z-loss included), `grad_norm` and `lr` belong to
optimiser step i (computed on theta_{i-1}); `model_update`, `ln_input_norm`, the output log Z
(`log_z_mean`, `log_z_max`), the largest attention logit (`max_attn_logit`, layers rows) and the
eval columns are measured on theta_i, after the step; `relative_update` (layers rows) is step
i's update of each sublayer relative to its weights after it. Step 0 is theta_0, before any
update, with the at-init probes' cells (probe.at_init).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig

from stabexp.data import Task
from stabexp.probes.base import ProbeSet, Rows
from stabexp.terminal import duration
from stabexp.tracking import Trackers
from stabexp.train.files import CsvLog

log = logging.getLogger("stabexp")


def metrics_columns(eval_columns, probe_columns: Sequence[str] = ()) -> list:
    """metrics.csv's header: the step's own columns and the built-in probes', the task's eval
    columns, then the columns of plug-in probes (`probe_columns`, those not already there)."""
    columns = ["step", "lr", "loss", "grad_norm", "model_update", "output_change", "log_z_mean", "log_z_max",
               *eval_columns]
    return columns + [c for c in dict.fromkeys(probe_columns) if c not in columns] + ["elapsed_s"]


METRICS_COLUMNS = metrics_columns(Task.eval_columns)  # the synthetic tasks' (translation adds eval_ppl, valid_bleu)
# A row is a residual sublayer (param empty) or, with probe.weights, one weight matrix (param set).
LAYERS_COLUMNS = ["step", "stack", "layer", "sublayer", "param", "grad_norm", "ln_input_norm", "stream_norm",
                  "max_attn_logit", "relative_update", "input_change", "w2_grad_norm", "output_grad_norm",
                  "weight_norm", "angular_update", "row_angular_update", "effective_lr", "scale_invariant", "elements",
                  "grad_cosine", "init_distance"]


def layers_columns(probe_columns: Sequence[str] = ()) -> List[str]:
    """layers.csv's columns: the built-in probes' (LAYERS_COLUMNS), then those of plug-in probes
    (`probe_columns`, those not already there)."""
    return LAYERS_COLUMNS + [c for c in dict.fromkeys(probe_columns) if c not in LAYERS_COLUMNS]


def eval_results(result: Dict, row: Dict) -> None:
    """An eval row's scores into a run's results: the best eval loss so far (a finite one), the
    final eval loss and accuracy."""
    best = result.get("best_eval_loss")
    if math.isfinite(row["eval_loss"]) and (best is None or row["eval_loss"] < best):
        result["best_eval_loss"] = row["eval_loss"]
    result.update(final_eval_loss=row["eval_loss"], final_eval_acc=row.get("eval_acc"))


class Recorder:
    """A run folder's row files: metrics.csv, layers.csv and each probe's own (Probe.files),
    written from the probes' merged Rows of a moment; the trackers see every row as written. A
    checkpoint records each file's position, and a resumed run reopens them cut back to it (a
    file an older checkpoint has no position for keeps its rows up to the checkpoint's step)."""

    def __init__(self, out_dir: Path, metrics_columns: Sequence[str], sublayer_keys: Sequence[Tuple],
                 files: Dict[str, Sequence[str]], layers_columns: Sequence[str] = LAYERS_COLUMNS,
                 trackers: Optional[Trackers] = None, resume: Optional[Dict] = None):
        self.sublayer_keys = list(sublayer_keys)
        trackers = trackers if trackers is not None else Trackers()
        positions = resume["csv"] if resume is not None else {}

        def open_log(name: str, columns, on_write=None) -> CsvLog:
            path, key = Path(out_dir) / name, Path(name).stem
            if resume is not None and positions.get(key) is None:
                return CsvLog.cut_at_step(path, columns, resume["step"], on_write=on_write)
            return CsvLog(path, columns, resume_at=positions.get(key), on_write=on_write)

        self.metrics = open_log("metrics.csv", metrics_columns, trackers.metrics_rows)
        self.layers = open_log("layers.csv", layers_columns, trackers.layers_rows)
        self.files = {name: open_log(name, columns) for name, columns in files.items()}

    @classmethod
    def for_probes(cls, out_dir: Path, probes: ProbeSet, eval_columns: Sequence[str],
                   trackers: Optional[Trackers] = None, resume: Optional[Dict] = None) -> "Recorder":
        """The files of these probes on the model their adapter describes; a plug-in probe's
        metrics columns go after the eval columns, its layers columns after the built-ins'."""
        columns = metrics_columns(eval_columns, [c for p in probes for c in p.metrics_columns])
        sublayers = [(s.stack, s.layer, s.name) for s in probes.ctx.adapter.sublayers()]
        return cls(out_dir, columns, sublayers, probes.files(), trackers=trackers, resume=resume,
                   layers_columns=layers_columns([c for p in probes for c in p.layers_columns]))

    def write(self, row: Dict, rows: Optional[Rows] = None) -> Dict:
        """One step's files: the sublayer rows (when a probe measured them) and any whole layers
        rows, the probes' own files, then the metrics row (`row`: step, lr, loss, eval columns,
        elapsed_s; the probes' metrics cells added)."""
        if rows is not None:
            step = row["step"]
            layers = [{"step": step, "stack": stack, "layer": layer, "sublayer": name, **cells}
                      for (stack, layer, name), cells in zip(self.sublayer_keys, rows.sublayers or [])]
            if rows.sublayers is not None or rows.layers:
                self.layers.write(layers + rows.layers)
            self.write_files(rows)
            row = {**row, **rows.metrics}
        self.metrics.write([row])
        return row

    def write_files(self, rows: Rows) -> None:
        for name, file_rows in rows.files.items():
            self.files[name].write(file_rows)

    def logs(self) -> List[CsvLog]:
        return [self.metrics, self.layers, *self.files.values()]

    def positions(self) -> Dict[str, Tuple[int, int]]:
        return {Path(log.path).stem: log.position() for log in self.logs()}

    def sync(self) -> None:
        for log_file in self.logs():
            log_file.sync()

    def close(self) -> None:
        for log_file in self.logs():
            log_file.close()


def group_name(cfg: DictConfig) -> str:
    """A group is a residual placement of the Transformer; NormMLP has none: it goes by its name."""
    return cfg.model.arch if cfg.model.arch == "normmlp" else cfg.group.name


class Progress:
    """How far a run is, from its first step: on a terminal a tqdm bar (steps/s, time left,
    the loss and model update at probe steps); otherwise a log line at the first step, then
    every probe.log_every steps and at least every LINE_SECONDS, each with steps/s and the time
    left, so a log shows a run is moving without a line per step."""

    LINE_SECONDS = 30.0
    bar_allowed = True  # false in a packed sweep's job process: several bars on one terminal clash

    def __init__(self, cfg: DictConfig, enabled: bool = True):
        self.cfg, self.every, self.last_update = cfg, cfg.probe.log_every, float("nan")
        self.enabled, self.bar = enabled, None
        self.use_bar = enabled and self.bar_allowed and sys.stderr.isatty()
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
        """`loss`: None at the steps whose loss the host has not read (GPU, Cadence.must_sync)."""
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
