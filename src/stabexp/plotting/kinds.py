"""The kinds of plot the papers draw again and again, each a function of the collected tables
(or of a frame cut from them) that returns a matplotlib figure, or None when there is nothing to
draw. The figures table (plotting/table.py) names a kind and its arguments for most figures;
the one-off figures of plotting/deepnet.py, admin.py and others.py draw their panels with the
axes-level helpers here where they can.

- `over_steps`: a metric against the step, a line per run (DeepNet Fig. 4's model update, the
  training curves of a sweep);
- `over_depth`: a metric against depth, a line per group, the mean over seeds (DeepNet Fig. 5 /
  Fig. 6 / Fig. 8);
- `lr_sensitivity`: Wortsman et al. 2023's final loss against the learning rate, with the logit
  and log Z growth at the largest learning rates;
- `update_bound`: DeepNet Theorems 4.1 / 4.3, the bound against the measured update.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from stabexp.analysis import lr_sensitivity_table, run_setting, update_bound_steps
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, group_color, ordered_groups, run_labels, run_order

# A panel's column, its axis label, and the axis scale ("linear", "log", or "symlog").
Panel = Tuple[str, str, str]


def over_steps(frame: pd.DataFrame, runs: pd.DataFrame, panels: Sequence[Panel], facet: Optional[str] = None,
               title: str = "", step_scale: str = "linear", references: Dict[str, str] = None,
               markers: Sequence[str] = ("eval_loss", "valid_bleu")):
    """A metric against the step, a line per run in its group's colour: a row of panels per
    column of `panels` and, with `facet` (depth, stack), a column per value of it; without,
    the panels side by side. A diverged run's line ends where it diverged, its label says at
    which step. `references` {runs column: label}: a grey line at each run-table value (the
    chance loss, the unigram loss) on every panel. `frame` holds run, group, step and the
    panels' columns (and the facet's)."""
    shown = [p for p in panels if p[0] in frame and frame[p[0]].notna().any()]
    if frame.empty or not shown:
        return None
    facets = sorted(frame[facet].dropna().unique()) if facet else [None]
    rows, columns = (len(shown), len(facets)) if facet else (1, len(shown))
    fig, axes = plt.subplots(rows, columns, squeeze=False, sharex="col" if facet else False,
                             figsize=(FIGSIZE_PER_PANEL[0] * columns, FIGSIZE_PER_PANEL[1] * rows))
    labels = run_labels(runs) if not runs.empty else {}
    diverged = (runs[runs.status == "diverged"].set_index("run").diverged_at_step
                if not runs.empty and "diverged_at_step" in runs else pd.Series(dtype=float))
    for j, value in enumerate(facets):
        here = frame if facet is None else frame[frame[facet] == value]
        for i, (column, label, scale) in enumerate(shown):
            ax = axes[i][j] if facet else axes[0][i]
            points = here.dropna(subset=[column])
            if scale in ("log", "symlog") or step_scale == "log":
                points = points[points.step >= 1]  # the update at step 0 is 0
            for run in run_order(points):
                r = points[points.run == run]
                name = labels.get(run, r.group.iloc[0])
                if run in diverged.index:
                    name += f" (diverged @ {int(diverged[run])})"
                ax.plot(r.step, r[column], color=group_color(r.group.iloc[0]), lw=1.3, label=name,
                        marker="o" if column in markers else None, ms=2.5)
            for key, text in (references or {}).items():
                values = runs[key].dropna() if key in runs else []
                if len(values):
                    ax.axhline(values.iloc[0], color="grey", ls=":", lw=1, label=text)
            if scale == "symlog":
                ax.set_yscale("symlog", linthresh=1e-3)
            else:
                ax.set_yscale(scale)
            ax.set_xscale(step_scale)
            ax.set_ylabel(label)
            if facet and i == 0:
                ax.set_title(f"{facet} {value}" if facet != "depth" else f"{int(value)} layers", fontsize=9)
            if not facet or i == rows - 1:
                ax.set_xlabel("step")
    axes[0][-1].legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def training_curves(tables: dict, title: str):
    """Training loss, eval loss and model update over the steps, a line per run: what a sweep of
    very deep models shows of its training."""
    return over_steps(tables["metrics"], tables["runs"],
                      [("loss", "training loss", "linear"), ("eval_loss", "eval loss", "linear"),
                       ("model_update", "model update", "symlog")], title=title)


def depth_lines(ax, frame: pd.DataFrame, column: str, groups: Optional[Sequence[str]] = None) -> None:
    """On one panel: `column` against depth, a line per group (mean over seeds), log depth axis
    with each depth a tick."""
    for group in ordered_groups(frame.group if groups is None else groups):
        rows = frame[frame.group == group].groupby("depth")[column].mean()
        if not rows.empty:
            ax.plot(rows.index, rows.values, "o-", ms=4, lw=1.2, color=group_color(group), label=group)
    depths = sorted(frame.depth.unique())
    ax.set_xscale("log")
    ax.set_xticks(depths, [str(int(d)) for d in depths])
    ax.xaxis.set_minor_formatter(NullFormatter())


def over_depth(frame: pd.DataFrame, column: str, ylabel: str, facet: Optional[str] = None,
               facet_title: Callable = str, log_y: bool = False, extra: Optional[Callable] = None,
               xlabel: str = "depth N (N L-N L)", min_depths: int = 1):
    """`column` against depth, a line per group (the mean over seeds), a panel per value of
    `facet` (the step); `extra(ax)` draws more on each panel (a paper's values). None with
    fewer than `min_depths` depths."""
    data = frame.dropna(subset=[column])
    if data.empty or data.depth.nunique() < min_depths:
        return None
    facets = sorted(data[facet].unique()) if facet else [None]
    fig, axes = plt.subplots(1, len(facets), squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * max(len(facets), 1.3), FIGSIZE_PER_PANEL[1]))
    for ax, value in zip(axes[0], facets):
        depth_lines(ax, data if facet is None else data[data[facet] == value], column)
        if extra is not None:
            extra(ax)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if facet:
            ax.set_title(facet_title(value), fontsize=9)
    axes[0][-1].legend(fontsize=7, ncol=2 if data.group.nunique() > 8 else 1)
    fig.tight_layout()
    return fig


def update_vs_depth(metrics: pd.DataFrame, extra: Optional[Callable] = None, last: Optional[int] = None):
    """DeepNet's model update against depth (v1 Fig. 5): a panel per update (1, 10 and `last`,
    the last probed step by default), a line per group, the mean over seeds at each depth."""
    data = metrics.dropna(subset=["model_update"])
    if data.empty:
        return None
    steps = {1, 10, int(data.step.max()) if last is None else last} & set(data.step.unique())
    return over_depth(data[data.step.isin(steps)], "model_update", "model update ||F(x,θ_i) − F(x,θ_0)||",
                      facet="step", facet_title=lambda s: f"step {s}", log_y=True, extra=extra, min_depths=2)


def lr_sensitivity(tables):
    """Wortsman et al. 2023 (arXiv 2309.14322) Fig. 1 / 3 style, for any lr sweep: (left) final
    validation loss against the learning rate, a line per setting, a diverged run drawn at the
    loss at init; (middle) the largest attention logit over all layers against the step, and
    (right) the largest output log Z, both at the two highest learning rates of the grid."""
    runs, metrics, layers = tables["runs"], tables["metrics"], tables["layers"]
    if runs.lr.nunique() < 2 or "max_attn_logit" not in layers:
        return None
    table = lr_sensitivity_table(runs, metrics)
    settings = list(dict.fromkeys(table.setting))
    # One colour per setting; the seeds of a setting share it.
    unseeded = {s: " ".join(p for p in s.split() if not p.startswith("seed=")) for s in settings}
    shades = {u: f"C{i}" for i, u in enumerate(dict.fromkeys(unseeded.values()))}
    colors = {s: shades[unseeded[s]] for s in settings}
    fig, axes = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1] * 1.15))
    ax = axes[0]
    for setting, rows in table.groupby("setting", sort=False):
        shown = rows.final_eval_loss.fillna(rows.loss_0)
        ax.plot(rows.lr, shown, "o-", color=colors[setting], lw=1.4,
                label=f"{setting} (LR sens. {rows.lr_sensitivity.iloc[0]:.3f})")
        failed = rows[rows.final_eval_loss.isna()]
        ax.plot(failed.lr, failed.loss_0, "x", color=colors[setting], ms=9)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final validation loss (x: diverged, at loss_0)")
    ax.legend(fontsize=6)
    top_lrs = sorted(runs.lr.unique())[-2:]
    logits = (layers.dropna(subset=["max_attn_logit"]).groupby(["run", "step"], as_index=False)
              .max_attn_logit.max())
    for ax, frame, column, title in ((axes[1], logits, "max_attn_logit", "largest attention logit (all layers)"),
                                     (axes[2], metrics.dropna(subset=["log_z_max"]), "log_z_max", "largest output log Z")):
        for _, r in runs[runs.lr.isin(top_lrs)].sort_values("lr").iterrows():
            rows = frame[frame.run == r.run]
            style = "-" if r.lr == top_lrs[-1] else ":"
            ax.plot(rows.step, rows[column], style, color=colors[run_setting(r)], lw=1.3,
                    label=f"lr {r.lr:g}, {run_setting(r)}")
        ax.set_xlabel("step")
        ax.set_ylabel(column)
        ax.set_title(title, fontsize=9)
    axes[1].set_yscale("log")
    axes[2].legend(fontsize=5.5)
    fig.tight_layout()
    return fig


def update_bound(tables):
    """DeepNet Theorem 4.1 / 4.3 measured (probe.update_bound): left, the bound (solid) and the
    model update relative to ||F(x, theta_0)|| (dashed) over the steps of the deepest runs; right,
    both at the first probe step against depth (where every depth's sublayers moved alike), a
    line per group."""
    steps = update_bound_steps(tables["metrics"], tables["update_bound"], tables["runs"])
    if steps.empty:
        return None
    fig, (over, depth) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1]))
    deepest = steps[steps.depth == steps.depth.max()]
    first = steps[steps.step == steps.step.min()]
    for group in ordered_groups(steps.group):
        color = group_color(group)
        rows = deepest[deepest.group == group].groupby("step")[["bound", "measured"]].mean()
        over.plot(rows.index, rows.bound, "-", color=color, label=f"{group} bound")
        over.plot(rows.index, rows.measured, "--", color=color, label=f"{group} measured")
        at_first = first[first.group == group].groupby("depth")[["bound", "measured"]].mean()
        depth.plot(at_first.index, at_first.bound, "o-", color=color, label=f"{group} bound", ms=4)
        depth.plot(at_first.index, at_first.measured, "s--", color=color, mfc="none", label=f"{group} measured", ms=4)
    over.set_title(f"{int(steps.depth.max())} layers", fontsize=9)
    over.set_xlabel("step")
    depth.set_xlabel("layers")
    depth.set_title(f"at step {int(first.step.min())}", fontsize=9)
    over.set_xscale("log")
    for ax in (over, depth):
        ax.set_yscale("log")
        ax.set_ylabel("model update / ||F(x, theta_0)||")
        ax.legend(fontsize=6)
    depth.set_xscale("log")
    depths = sorted(steps.depth.unique())
    depth.set_xticks(depths, [str(int(d)) for d in depths])
    depth.minorticks_off()
    fig.tight_layout()
    return fig


def per_stack_mean(layers: pd.DataFrame, column: str) -> pd.DataFrame:
    """`column` of the layers table averaged over each stack's sublayers: a row per run, stack
    and step (what `over_steps` draws with facet="stack")."""
    rows = layers.dropna(subset=[column])
    return rows.groupby(["run", "group", "stack", "step"], as_index=False)[column].mean()


def per_layer_grad_norm(layers: pd.DataFrame) -> pd.DataFrame:
    """Each layer's gradient norm: its sublayers' norms combined in quadrature (the root of the
    sum of their squares), a row per run, stack, step and layer."""
    rows = layers.dropna(subset=["grad_norm"])
    rows = rows.assign(sq=rows.grad_norm ** 2)
    out = rows.groupby(["run", "group", "stack", "step", "layer"], as_index=False).sq.sum()
    return out.assign(grad_norm=np.sqrt(out.sq)).drop(columns="sq")
