"""Spherical motion dynamics (Wan et al. 2021; Kosson et al. 2023): for each optimiser, the
angular update per step of the scale-invariant weights (mean over them, running mean of 10 probe
rows) with the theory as a dashed line (top), and their mean norm with the predicted equilibrium
norm over the averaging window (bottom); right, measured / predicted equilibrium angular update
against lr x weight decay, and the time to equilibrium against the time constant.
Preset: smd."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.analysis import is_scale_invariant, smd_equilibrium
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main

EXPERIMENT = "smd"
OPTIMISERS = ["sgd", "sgdm", "adamw"]
MARKERS = {"sgd": "o", "sgdm": "s", "adamw": "^"}


def draw(tables):
    runs, layers = tables["runs"], tables["layers"]
    if layers.empty or "angular_update" not in layers or runs.theory_angular_update.isna().all():
        return None
    summary = smd_equilibrium(runs, layers).set_index("run")
    optimisers = [o for o in OPTIMISERS if o in set(runs.optim)]
    fig, axes = plt.subplots(2, len(optimisers) + 1, squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * (len(optimisers) + 1), FIGSIZE_PER_PANEL[1] * 2))
    cmap = plt.get_cmap("viridis")
    pairs = sorted(set(zip(runs.lr, runs.weight_decay)))
    colour = {p: cmap(i / max(len(pairs) - 1, 1) * 0.85) for i, p in enumerate(pairs)}
    invariant = layers[is_scale_invariant(layers)]
    for col, optim in enumerate(optimisers):
        top, bottom = axes[0][col], axes[1][col]
        for _, run in runs[runs.optim == optim].sort_values(["lr", "weight_decay"]).iterrows():
            rows = invariant[invariant.run == run.run].dropna(subset=["angular_update"])
            mean = rows.groupby("step")[["angular_update", "weight_norm"]].mean()
            c = colour[(run.lr, run.weight_decay)]
            label = f"lr {run.lr:g}, wd {run.weight_decay:g}"
            top.plot(mean.index, mean.angular_update.rolling(10, min_periods=1).mean(), color=c, lw=1.2, label=label)
            top.axhline(run.theory_angular_update, color=c, ls="--", lw=0.9)
            bottom.plot(mean.index, mean.weight_norm, color=c, lw=1.2, label=label)
            if run.run in summary.index and np.isfinite(summary.loc[run.run, "norm_ratio"]):
                start = summary.loc[run.run, "window_from"]
                in_window = mean[mean.index >= start].weight_norm.mean()
                predicted = in_window / summary.loc[run.run, "norm_ratio"]
                bottom.hlines(predicted, start, mean.index.max(), color=c, ls="--", lw=0.9)
        top.set_yscale("log")
        top.set_title(f"{optim}: angular update (dashed: theory)")
        top.set_xlabel("step")
        top.set_ylabel("Δ_t, scale-invariant weights (rad)")
        top.legend(fontsize=6)
        bottom.set_yscale("log")
        bottom.set_title(f"{optim}: ||w_t|| (dashed: predicted equilibrium)")
        bottom.set_xlabel("step")
        bottom.set_ylabel("mean weight norm")
    ratio_ax, time_ax = axes[0][-1], axes[1][-1]
    # A run shorter than its averaging window (a quick pass) has no equilibrium to show.
    summary = summary[np.isfinite(summary.ratio)]
    if summary.empty:
        for ax in (ratio_ax, time_ax):
            ax.text(0.5, 0.5, "no run reached\nits averaging window", ha="center", va="center",
                    transform=ax.transAxes)
        fig.tight_layout()
        return fig
    for optim in optimisers:
        rows = summary[summary.optim == optim]
        ratio_ax.scatter(rows.lr_x_wd, rows.ratio, marker=MARKERS[optim], label=optim)
        settled = rows[np.isfinite(rows.time_to_equilibrium)]
        time_ax.scatter(settled.time_constant, settled.time_to_equilibrium, marker=MARKERS[optim], label=optim)
    ratio_ax.axhline(1.0, color="k", lw=0.8)
    ratio_ax.axhspan(0.9, 1.1, color="0.9", zorder=0)
    ratio_ax.set_xscale("log")
    ratio_ax.set_xlabel("lr × weight decay")
    ratio_ax.set_ylabel("measured / predicted Δ at equilibrium")
    ratio_ax.set_title("equilibrium angular update (band: ±10%)")
    ratio_ax.legend(fontsize=7)
    span = np.array([summary.time_constant.min(), summary.time_constant.max()])
    time_ax.plot(span, span, color="k", lw=0.8, label="= time constant")
    time_ax.set_xscale("log")
    time_ax.set_yscale("log")
    time_ax.set_xlabel("predicted time constant (steps)")
    time_ax.set_ylabel("measured time to equilibrium (steps)")
    time_ax.set_title("time to equilibrium (within 10%)")
    time_ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("smd", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
