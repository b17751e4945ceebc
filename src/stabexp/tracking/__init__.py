"""Trackers a run logs to besides its files: TensorBoard, MLflow, Weights & Biases
(`logger=tensorboard|mlflow|wandb`, several at once; docs/tracking.md).

The run folder stays the record: a tracker sees exactly the rows the run writes to metrics.csv
and layers.csv (train/files.py's CsvLog hands each written row on), and writes nothing into the
run folder, so its files are the same, byte for byte, with or without trackers. What a tracker
gets: every metrics.csv column at its step; each sublayer's probe columns as one scalar each,
`grad_norm/decoder/17/ffn` (and `.../ffn/w2` for a weight matrix's rows); the resolved config
and the constants of the init rule (DeepNorm's alpha and beta, Admin's omegas, ...) as
hyper-parameters; at the end summary.json's fields and two figures of the run.

A sweep is grouped the tracker's way, by the sweep folder that holds the run folders: one
TensorBoard log dir with a sub-folder per run, one MLflow experiment, one W&B group. A resumed
run continues its tracker run (ids kept in the checkpoint) without logging a step twice:
TensorBoard hides the events after the checkpoint (its purge_step) and takes them again;
MLflow and W&B, which cannot forget a point, skip the steps they already hold (those the
interrupted process wrote to the CSV files, which the resumed run writes again, identical).

A tracker that fails is a warning, and the run goes on without it. Only rank 0 of a run on K
processes logs.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from omegaconf import DictConfig

from stabexp import distributed
from stabexp.errors import ConfigError, install_hint
from stabexp.train.files import read_csv_rows

log = logging.getLogger("stabexp")

# logger name -> the package it needs (installed by the extra of the same name)
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
WANDB_MODES = ("online", "offline", "disabled")


def chosen(cfg: DictConfig) -> List[str]:
    """The trackers a config turns on, in a fixed order."""
    loggers = cfg.get("logger")
    return [name for name in PACKAGES if loggers is not None and loggers.get(name) is not None]


def check(cfg: DictConfig) -> None:
    """What a run's trackers need, checked before anything is written: their packages, and the
    values a type cannot check."""
    for name in chosen(cfg):
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(f"logger={name} needs the {PACKAGES[name]} package, which is not installed: "
                              f"{install_hint(name)}")
    if "wandb" in chosen(cfg):
        mode = cfg.logger.wandb.mode
        if mode is not None and mode not in WANDB_MODES:
            raise ConfigError(f"logger.wandb.mode={mode} is not allowed: one of {', '.join(WANDB_MODES)} "
                              "(or null: $WANDB_MODE, else online when the service answers)")


class RunInfo:
    """Who a tracker run is: the run folder, its sweep (the folder above it) and how it starts."""

    def __init__(self, cfg: DictConfig, out_dir: Path, state: Optional[Dict]):
        self.cfg, self.out_dir = cfg, Path(out_dir).resolve()
        self.name, self.sweep_dir = self.out_dir.name, self.out_dir.parent
        self.sweep = self.sweep_dir.name
        self.resumed = state is not None
        self.checkpoint_step = state["step"] if state else 0
        self.ids = dict(state.get("trackers") or {}) if state else {}  # each tracker's own run id
        # The steps an interrupted process already handed to the trackers: those in its CSV files.
        self.logged_until = last_step(self.out_dir) if state else -1


def last_step(out_dir: Path) -> int:
    """The last step in a run folder's metrics.csv and layers.csv, -1 when there is none."""
    steps = [int(row["step"]) for name in ("metrics.csv", "layers.csv")
             for row in read_csv_rows(Path(out_dir) / name)[-1:]]
    return max(steps, default=-1)


class Trackers:
    """The trackers of one run, each behind the same few calls; a tracker that raises is
    dropped with a warning. Empty (every call a no-op) when no logger is chosen, and on ranks
    other than 0."""

    def __init__(self, backends: Iterable = ()):
        self.backends = list(backends)

    @classmethod
    def open(cls, cfg: DictConfig, out_dir: Path, state: Optional[Dict] = None) -> "Trackers":
        names = chosen(cfg)
        if not names or not distributed.is_rank0():
            return cls()
        from stabexp.tracking.backends import BACKENDS

        info = RunInfo(cfg, out_dir, state)
        trackers = cls()
        for name in names:
            trackers._call(name, lambda: trackers.backends.append(BACKENDS[name](info, cfg.logger[name])))
        return trackers

    def _call(self, name: str, action) -> None:
        try:
            action()
        except Exception as err:  # a tracker must never stop a run
            log.warning("logger %s failed and is off for the rest of this run: %s: %s", name,
                        type(err).__name__, str(err).splitlines()[0] if str(err) else "")
            self.backends = [b for b in self.backends if b.name != name]

    def _each(self, method: str, *args) -> None:
        for backend in list(self.backends):
            self._call(backend.name, lambda: getattr(backend, method)(*args))

    def start(self, summary: Dict) -> None:
        """The config and the init rule's constants (in summary.json by now) as
        hyper-parameters."""
        if self.backends:
            self._each("start", hyperparameters(self.backends[0].info.cfg, summary))

    def metrics_rows(self, rows: List[Dict]) -> None:
        """Rows as written to metrics.csv: each column at its step."""
        if not self.backends:  # every run's rows come here: no tracker, no work
            return
        for row in rows:
            values = {k: float(v) for k, v in row.items() if k != "step" and _measured(v)}
            self._each("scalars", int(row["step"]), values)

    def layers_rows(self, rows: List[Dict]) -> None:
        """Rows as written to layers.csv: each sublayer's (or weight matrix's) probe columns."""
        if not self.backends:
            return
        by_step: Dict[int, Dict[str, float]] = {}
        for row in rows:
            by_step.setdefault(int(row["step"]), {}).update(layer_scalars(row))
        for step, values in by_step.items():
            if values:
                self._each("scalars", step, values)

    def state(self) -> Dict:
        """What a checkpoint keeps, so that a resumed run continues the same tracker runs."""
        return {b.name: b.run_id for b in self.backends if getattr(b, "run_id", None) is not None}

    def finish(self, summary: Dict, out_dir: Path) -> None:
        """summary.json's fields, the run's figures, and the tracker runs closed."""
        if not self.backends:
            return
        figures = []
        if summary.get("status") in ("completed", "diverged"):
            try:
                figures = run_figures(Path(out_dir))
            except Exception as err:
                log.warning("no figures for the trackers: %s: %s", type(err).__name__, err)
        self._each("finish", summary_values(summary), summary.get("status"), figures)
        if figures:
            import matplotlib.pyplot as plt

            for _, fig in figures:
                plt.close(fig)
        self.close()

    def close(self) -> None:
        self._each("close")
        self.backends = []


# --- what a tracker is given -----------------------------------------------------------------

# layers.csv columns that are a measurement per step (scale_invariant and elements describe the
# matrix and do not change).
LAYER_VALUES = ("grad_norm", "ln_input_norm", "stream_norm", "max_attn_logit", "relative_update",
                "input_change", "w2_grad_norm", "output_grad_norm", "weight_norm", "angular_update",
                "row_angular_update", "effective_lr", "grad_cosine")


def layer_scalars(row: Dict) -> Dict[str, float]:
    """`column/stack/layer/sublayer[/param]` -> value for the measured columns of one layers.csv
    row (a cell left empty or NaN, not measured at that step, is left out)."""
    where = "/".join(str(row[k]) for k in ("stack", "layer", "sublayer"))
    if row.get("param"):
        where += f"/{row['param']}"
    return {f"{column}/{where}": float(row[column]) for column in LAYER_VALUES if _measured(row.get(column))}


def _measured(value) -> bool:
    """A number, and not the NaN of a cell not measured at that step (a diverged loss's inf is
    kept; a NaN loss is in summary.json's status and diverged_at_step)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def flatten(tree, prefix: str = "") -> Dict[str, object]:
    """Nested dicts and lists as `a.b.c` -> scalar (lists of scalars as one string)."""
    out: Dict[str, object] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(tree, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in tree):
        for i, value in enumerate(tree):
            out.update(flatten(value, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = str(list(tree)) if isinstance(tree, (list, tuple)) else tree
    return out


def hyperparameters(cfg: DictConfig, summary: Dict) -> Dict[str, object]:
    """The resolved config (the trackers themselves aside) and what the run resolved at init:
    the constants of its placement and init rule, its parameter count."""
    from stabexp.config import resolved

    params = flatten(resolved(cfg))
    params.update(flatten({"constants": summary.get("constants") or {}}))
    if summary.get("parameters") is not None:
        params["parameters"] = summary["parameters"]
    return params


def summary_values(summary: Dict) -> Dict[str, float]:
    """summary.json's numbers (test BLEU, final losses, diverged_at_step, ...) by name."""
    skip = ("constants", "theory", "optim", "decoder_depth", "depth", "seed", "d_model", "steps")
    return {key: float(value) for key, value in summary.items()
            if key not in skip and isinstance(value, (int, float)) and not isinstance(value, bool)}


def run_figures(out_dir: Path):
    """Two figures of the run, from its CSV files: the loss and the model update against the
    step, and each sublayer's gradient norm at the last probe step, by layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    figures = []
    metrics = pd.read_csv(out_dir / "metrics.csv")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, column in zip(axes, ("loss", "model_update")):
        data = metrics[["step", column]].dropna()
        ax.plot(data.step, data[column], marker=".")
        ax.set(xlabel="step", ylabel=column, yscale="log" if column == "model_update" and (data[column] > 0).all()
               and len(data) else "linear")
    fig.suptitle(out_dir.name, fontsize=8)
    fig.tight_layout()
    figures.append(("model_update", fig))
    layers_path = out_dir / "layers.csv"
    if layers_path.exists():
        layers = pd.read_csv(layers_path)
        layers = layers[layers["param"].isna()] if "param" in layers else layers
        probed = layers.dropna(subset=["grad_norm"])
        if len(probed):
            last = probed[probed.step == probed.step.max()]
            fig, ax = plt.subplots(figsize=(5, 3.4))
            for (stack, sublayer), rows in last.groupby(["stack", "sublayer"]):
                ax.plot(rows.layer, rows.grad_norm, marker=".", label=f"{stack} {sublayer}")
            ax.set(xlabel="layer", ylabel="grad_norm", yscale="log" if (last.grad_norm > 0).all() else "linear",
                   title=f"step {int(last.step.iloc[0])}")
            ax.legend(fontsize=7)
            fig.tight_layout()
            figures.append(("grad_norm_by_layer", fig))
    return figures
