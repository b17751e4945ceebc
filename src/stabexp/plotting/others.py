"""The one-off figures of the other studies (Xiong et al. 2020's gradients at init, the
stabilisers of 2024-2025, spherical motion dynamics) and the Table 1 analogue: each a function of
the collected tables returning a figure or None; the figures table (plotting/table.py) names the
preset each draws."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from stabexp.analysis import is_scale_invariant, last_w2_grad, smd_equilibrium, w2_grad_slopes
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, group_color, ordered_groups


def grad_at_init(tables):
    """Gradients at initialisation against depth (Xiong et al. 2020, arXiv 2002.04745, Sec. 3):
    left, the gradient norm of each layer along the deepest models; middle, the gradient of
    the last decoder FFN's W_2 against depth on log-log axes with each group's slope (Post-
    LN: flat, Pre-LN: ~1/sqrt(L), slope -1/2); right, Pre-LN's E||x_l||^2 along the stack,
    which Xiong et al. show grows linearly in l."""
    layers = tables["layers"]
    if layers.empty:
        return None
    at_init = layers[layers.step == 0].dropna(subset=["grad_norm"])
    w2 = last_w2_grad(layers)
    if at_init.empty or w2.empty:
        return None
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1]))
    deepest = int(at_init.depth.max())
    rows = at_init[at_init.depth == deepest].assign(sq=lambda f: f.grad_norm ** 2)
    per_layer = rows.groupby(["run", "group", "stack", "layer"], as_index=False).sq.sum()
    per_layer["position"] = per_layer.layer + np.where(per_layer["stack"] == "decoder", deepest, 0)
    for group in ordered_groups(per_layer.group):
        mean = per_layer[per_layer.group == group].groupby("position").sq.mean().pow(0.5)
        left.plot(mean.index, mean.values, color=group_color(group), lw=1.2, label=group)
    left.axvline(deepest + 0.5, color="grey", lw=0.8)
    left.set_yscale("log")
    left.set_xlabel(f"layer (1-{deepest} encoder, then decoder)")
    left.set_ylabel("gradient norm at init")
    left.set_title(f"{deepest}L-{deepest}L, mean over seeds")
    left.legend(fontsize=7)

    slopes = w2_grad_slopes(w2).set_index("group")
    for group in ordered_groups(w2.group):
        rows = w2[w2.group == group]
        middle.scatter(rows.depth, rows.w2_grad_norm, s=10, color=group_color(group))
        mean = rows.groupby("depth").w2_grad_norm.mean()
        label = group + (f", slope {slopes.loc[group, 'slope']:+.2f}" if group in slopes.index else "")
        middle.plot(mean.index, mean.values, color=group_color(group), lw=1.2, label=label)
    depths = sorted(w2.depth.unique())
    middle.set_xscale("log")
    middle.set_yscale("log")
    middle.set_xticks(depths, [str(d) for d in depths])
    middle.xaxis.set_minor_formatter(NullFormatter())
    middle.set_xlabel("depth N (N L-N L)")
    middle.set_ylabel("||∂L/∂W_2|| of the last decoder FFN")
    middle.set_title("last-layer W_2 gradient at init")
    middle.legend(fontsize=7)

    preln = layers[(layers.step == 0) & (layers.group == "preln") & (layers.depth == deepest)]
    preln = preln.dropna(subset=["ln_input_norm"])
    for stack, ls in (("encoder", "-"), ("decoder", "--")):
        rows = preln[preln["stack"] == stack].copy()
        if rows.empty:
            continue
        rows["index"] = rows.groupby("run").cumcount() + 1
        mean = rows.groupby("index").ln_input_norm.apply(lambda v: (v ** 2).mean())
        right.plot(mean.index, mean.values, color=group_color("preln"), ls=ls, lw=1.2, label=f"preln {stack}")
    right.set_xlabel("sublayer along the stack")
    right.set_ylabel("||x_l||² per token (LN input)")
    right.set_title(f"Pre-LN residual stream at init, {deepest}L")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def curse_of_depth(tables):
    """The stabilisers of 2024-2025 against depth ("The Curse of Depth" Fig. 2, Mix-LN Fig. 1,
    Peri-LN's hidden-state norm): per depth above the shallowest, the eval-loss increase of
    skipping each layer at the end of training against the layer's position, a line per
    group (mean over seeds); last panel, the residual stream's norm per token entering each
    sublayer at the last probe step of the deepest runs."""
    importance, layers = tables["layer_importance"], tables["layers"]
    if importance.empty:
        return None
    last = importance[(importance.step == importance.groupby("run").step.transform("max")) & (importance.step > 0)]
    depths = sorted(d for d in last.depth.unique() if d > last.depth.min()) or [last.depth.max()]
    fig, axes = plt.subplots(1, len(depths) + 1, figsize=(FIGSIZE_PER_PANEL[0] * (len(depths) + 1), FIGSIZE_PER_PANEL[1]))
    for ax, depth in zip(axes, depths):
        here = last[last.depth == depth]
        for group in ordered_groups(here.group):
            curve = here[here.group == group].groupby("layer").loss_increase.mean()
            ax.plot(curve.index, curve.values, "o-", ms=3, lw=1.2, color=group_color(group), label=group)
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_xlabel("layer skipped")
        ax.set_ylabel("eval-loss increase (nats)")
        ax.set_title(f"{int(depth)} layers, after training", fontsize=9)
    axes[0].legend(fontsize=6)
    stream = layers.dropna(subset=["stream_norm"]) if "stream_norm" in layers else layers.iloc[:0]
    deepest = stream[(stream.depth == stream.depth.max()) & (stream.step == stream.groupby("run").step.transform("max"))]
    ax = axes[-1]
    for group in ordered_groups(deepest.group):
        rows = deepest[deepest.group == group].copy()
        rows["position"] = rows.groupby("run").cumcount() + 1
        curve = rows.groupby("position").stream_norm.mean()
        ax.plot(curve.index, curve.values, "-", lw=1.2, color=group_color(group), label=group)
    ax.set_yscale("log")
    ax.set_xlabel("sublayer (bottom to top)")
    ax.set_ylabel("residual stream norm per token")
    if len(deepest):
        ax.set_title(f"{int(deepest.depth.max())} layers, last probe step", fontsize=9)
    fig.tight_layout()
    return fig


OPTIMISERS = ["sgd", "sgdm", "adamw"]
MARKERS = {"sgd": "o", "sgdm": "s", "adamw": "^"}


def smd(tables):
    """Spherical motion dynamics (Wan et al. 2021; Kosson et al. 2023): for each optimiser, the
    angular update per step of the scale-invariant weights (mean over them, running mean of
    10 probe rows) with the theory as a dashed line (top), and their mean norm with the
    predicted equilibrium norm over the averaging window (bottom); right, measured /
    predicted equilibrium angular update against lr x weight decay, and the time to
    equilibrium against the time constant."""
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


def depth_table(tables):
    """The analogue of DeepNet's Table 1 (Wang et al. 2022) as a figure: every group at every
    depth after the same update budget, "diverged @ k" where the loss exploded. On the
    synthetic task (preset depth_table) a cell is the final eval loss, coloured against the
    chance loss; on Multi30k (preset multi30k_table) it is the test BLEU, with the final
    validation loss below it. `stabexp report` prints the same tables as markdown."""
    runs = tables["runs"]
    translation = "test_bleu" in runs and runs.test_bleu.notna().any()
    depths = sorted(int(d) for d in runs.depth.unique())
    groups = ordered_groups(runs.group)
    chance = float(runs.chance_loss.dropna().iloc[0]) if runs.chance_loss.notna().any() else np.nan
    values = np.full((len(groups), len(depths)), np.nan)
    height = max(FIGSIZE_PER_PANEL[1] * 1.2, 0.45 * len(groups) + 1.2)  # two text lines a cell
    fig, ax = plt.subplots(figsize=(FIGSIZE_PER_PANEL[0] * 1.6, height))
    for i, group in enumerate(groups):
        for j, depth in enumerate(depths):
            cell = runs[(runs.group == group) & (runs.depth == depth)]
            done = cell[cell.status == "completed"]
            diverged = cell[cell.status == "diverged"]
            if not done.empty and translation:
                values[i, j] = done.test_bleu.mean()
                text = f"BLEU {values[i, j]:.1f}\nloss {done.final_eval_loss.mean():.2f}"
            elif not done.empty:
                values[i, j] = done.final_eval_loss.mean()
                text = f"{values[i, j]:.3f}\nacc {done.final_eval_acc.mean():.2f}"
            elif not diverged.empty:
                text = f"diverged\n@ {int(diverged.diverged_at_step.min())}"
            else:
                text = "-"
            if translation:
                dark = np.isfinite(values[i, j]) and values[i, j] < 0.4 * np.nanmax(values)
            else:
                dark = np.isfinite(values[i, j]) and np.isfinite(chance) and values[i, j] > 0.6 * chance
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    if translation:
        image = ax.imshow(values, cmap="viridis", vmin=0, aspect="auto")
        label = "test BLEU (sacreBLEU)"
    else:
        image = ax.imshow(values, cmap="viridis_r", vmin=0, vmax=chance if np.isfinite(chance) else None,
                          aspect="auto")
        label = f"final eval loss (chance {chance:.2f})"
    fig.colorbar(image, ax=ax, label=label)
    ax.set_xticks(range(len(depths)), [f"{d}L-{d}L" for d in depths])
    ax.set_yticks(range(len(groups)), groups)
    steps = int(runs.steps_done.max()) if runs.steps_done.notna().any() else 0
    task = f"task {runs.task.dropna().iloc[0]}, " if runs.task.notna().any() else ""
    ax.set_title(f"{task}after {steps} updates (grey: diverged)")
    ax.set_facecolor("0.85")
    fig.tight_layout()
    return fig
