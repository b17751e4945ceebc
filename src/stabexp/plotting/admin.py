"""The one-off figures of Admin (Liu et al. 2020, arXiv 2004.08249) and Transformer-Clinic: each a
function of the collected tables returning a figure or None; the figures table
(plotting/table.py) names the preset each draws."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm

from stabexp import paper
from stabexp.analysis import (clinic_fits, encoder_input_change, output_change_fits, output_change_table,
                              output_gradients)
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, group_color, ordered_groups


def clinic(tables):
    """Admin Theorem 2 / Fig. 4 (Liu et al. 2020) as Transformer-Clinic measures it: along ONE
    deep encoder at init, the change of each sublayer's std-normalised input under delta =
    1e-4 sign(N(0,1)), against the sublayer index i; a panel per width, a line per group
    (mean over seeds, the band their min-max). Curves are divided by Post-LN's at the last
    sublayer, ours by ours and the paper's by the paper's, so the shapes and the Post-LN /
    Pre-LN gap compare although the batches differ; the markers are read off the paper's
    figure."""
    curves = encoder_input_change(tables["layers"])
    if curves.empty:
        return None
    fits = clinic_fits(curves)
    d_model = tables["runs"].drop_duplicates("model").set_index("model").d_model
    widths = sorted(curves.model.unique(), key=lambda m: d_model.get(m, 0))
    fig, axes = plt.subplots(1, len(widths), squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * 1.2 * len(widths), FIGSIZE_PER_PANEL[1] * 1.2))
    for ax, model in zip(axes[0], widths):
        rows = curves[(curves.model == model)]
        rows = rows[rows.depth == rows.depth.max()]
        by_index = rows.groupby(["group", "index"]).input_change
        mean, low, high = by_index.mean(), by_index.min(), by_index.max()
        scale = mean["postln"].iloc[-1] if "postln" in mean.index.get_level_values(0) else mean.max()
        paper_scale = paper.ADMIN_INPUT_CHANGE["postln"][200]
        for group in ordered_groups(rows.group):
            color = group_color(group)
            fit = fits[(fits.model == model) & (fits.group == group)]
            r2 = (f", R² lin {fit.linear_r2.iloc[0]:.3f} / log {fit.log_r2.iloc[0]:.3f}" if not fit.empty else "")
            ax.plot(mean[group].index, mean[group].values / scale, color=color, lw=1.4, label=group + r2)
            ax.fill_between(mean[group].index, low[group].values / scale, high[group].values / scale,
                            color=color, alpha=0.2, lw=0)
            if group in paper.ADMIN_INPUT_CHANGE:
                points = paper.ADMIN_INPUT_CHANGE[group]
                ax.plot(list(points), [v / paper_scale for v in points.values()], ls="none", marker="o",
                        mfc="none", color=color, label=f"{group}, read off Admin Fig. 4")
        n_runs = rows.groupby("group").run.nunique().min()
        ax.set_title(f"{model} (d = {d_model.get(model, '?')}), {int(rows.depth.max())}-layer encoder, "
                     f"{n_runs} seeds", fontsize=9)
        ax.set_xlabel("sublayer i (its input), bottom up")
        ax.set_ylabel("input change / Post-LN's at the last i")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def dependency(tables):
    """Admin's residual dependency (Liu et al. 2020, arXiv 2004.08249, Sec. 4.1), drawn as
    Transformer-Clinic's img/6_layer_dependency.png and 18_layer_dependency.png: for each
    encoder sublayer i (row) the share beta_ij of its output that comes from the embedding
    (j = 0) and each branch j <= i (columns), at init and at the end of training, a row of
    panels per group, a pair of columns per depth; the norms' bias part is left out."""
    dep = tables.get("dependency")
    if dep is None or dep.empty:
        return None
    dep = dep[(dep["stack"] == "encoder") & (dep.component >= 0)]
    if dep.empty:
        return None
    last = dep.groupby("run").step.transform("max")
    dep = dep.assign(when=np.where(dep.step == 0, "init", np.where(dep.step == last, "end", "")))
    groups, depths = ordered_groups(dep.group), sorted(dep.depth.unique())
    columns = [(d, w) for d in depths for w in ("init", "end")]
    fig, axes = plt.subplots(len(groups), len(columns), squeeze=False, layout="constrained",
                             figsize=(FIGSIZE_PER_PANEL[0] * 0.75 * len(columns), FIGSIZE_PER_PANEL[1] * 0.9 * len(groups)))
    image = None
    for r, group in enumerate(groups):
        for c, (depth, when) in enumerate(columns):
            ax = axes[r][c]
            rows = dep[(dep.group == group) & (dep.depth == depth) & (dep.when == when)]
            if rows.empty:
                ax.axis("off")
                continue
            n = int(rows.sublayer.max())
            grid = np.full((n, n + 1), np.nan)
            for (i, j), value in rows.groupby(["sublayer", "component"]).beta.mean().items():
                grid[int(i) - 1, int(j)] = value
            # Rows are sublayers 1..n from the top, columns components 0..n.
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto",
                              extent=(-0.5, n + 0.5, n + 0.5, 0.5))
            ax.set_title(f"{group}, {depth}L, {when}", fontsize=8)
            if r == len(groups) - 1:
                ax.set_xlabel("component j (0: embedding)", fontsize=7)
            if c == 0:
                ax.set_ylabel("sublayer i", fontsize=7)
            ax.tick_params(labelsize=6)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="beta_ij")
    return fig


def grad_vanishing(tables):
    """Admin's Theorem 1 (Liu et al. 2020, arXiv 2004.08249, Sec. 3): the gradient of every
    sublayer's output at init, relative to the largest in the network, along the encoder and
    then the decoder; a panel per depth, a line per group (mean over seeds, the band its
    min-max), the decoder's cross-attention sublayers marked. Post-LN's decoder vanishes
    toward the bottom, its encoder and Pre-LN do not; the hybrids show which stack carries
    it."""
    grads = output_gradients(tables["layers"])
    if grads.empty:
        return None
    depths = sorted(grads.depth.unique())
    fig, axes = plt.subplots(1, len(depths), figsize=(FIGSIZE_PER_PANEL[0] * 1.3 * len(depths), FIGSIZE_PER_PANEL[1]),
                             squeeze=False)
    for ax, depth in zip(axes[0], depths):
        rows = grads[grads.depth == depth]
        encoder_sublayers = int(rows[rows["stack"] == "encoder"]["index"].max())
        rows = rows.assign(position=rows["index"] + (rows["stack"] == "decoder") * encoder_sublayers)
        for group in ordered_groups(rows.group):
            by_position = rows[rows.group == group].groupby("position").relative
            mean, low, high = by_position.mean(), by_position.min(), by_position.max()
            color = group_color(group)
            ax.plot(mean.index, mean.values, color=color, lw=1.2, label=f"{group} ({rows[rows.group == group].run.nunique()} runs)")
            ax.fill_between(mean.index, low.values, high.values, color=color, alpha=0.15, lw=0)
            cross = rows[(rows.group == group) & (rows.sublayer == "cross_attn")].groupby("position").relative.mean()
            ax.scatter(cross.index, cross.values, color=color, s=9, marker="v")
        ax.axvline(encoder_sublayers + 0.5, color="grey", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel(f"sublayer (1-{encoder_sublayers} encoder, then decoder; ▼ cross-attention)")
        ax.set_ylabel("‖∂L/∂(sublayer output)‖ / largest")
        ax.set_title(f"{depth}L-{depth}L at init, mean over seeds")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def beta2(overrides) -> str:
    """A run's beta2, from its folder's overrides (`optim.betas=[0.9,0.98]`); "?" without one."""
    for part in str(overrides).split("__"):
        if part.startswith("optim.betas="):
            return part.split(",")[-1].rstrip("]")
    return "?"


def grid(tables):
    """Admin's (lr, beta2) grid without warm-up (Liu et al. 2020; Transformer-Clinic's
    iwslt14_de-en.md, "No Warmup"): a panel per group, a cell per lr and beta2, the final
    eval loss (colour, log scale) or "div" where the run diverged."""
    runs = tables["runs"]
    if runs.empty or runs.lr.nunique() < 2:
        return None
    runs = runs.assign(beta2=runs.overrides.map(beta2))
    groups, lrs, b2s = ordered_groups(runs.group), sorted(runs.lr.unique()), sorted(runs.beta2.unique())
    fig, axes = plt.subplots(1, len(groups), squeeze=False, sharey=True, layout="constrained",
                             figsize=(FIGSIZE_PER_PANEL[0] * 0.8 * len(groups), FIGSIZE_PER_PANEL[1] * 1.2))
    done = runs[runs.status == "completed"].final_eval_loss
    norm = LogNorm(vmin=max(done.min(), 1e-4), vmax=max(done.max(), done.min() * 10)) if len(done) else None
    image = None
    for ax, group in zip(axes[0], groups):
        grid = np.full((len(lrs), len(b2s)), np.nan)
        for _, r in runs[runs.group == group].iterrows():
            i, j = lrs.index(r.lr), b2s.index(r.beta2)
            if r.status == "completed":
                grid[i, j] = r.final_eval_loss
                dark = norm is not None and norm(r.final_eval_loss) > 0.6  # viridis_r: dark at high loss
                ax.text(j, i, f"{r.final_eval_loss:.2g}", ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
            else:
                ax.text(j, i, "div" if r.status == "diverged" else str(r.status), ha="center", va="center",
                        fontsize=6, color="red")
        image = ax.imshow(grid, norm=norm, cmap="viridis_r", aspect="auto", origin="lower")
        ax.set_xticks(range(len(b2s)), b2s, fontsize=7)
        ax.set_yticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.set_xlabel("beta2")
        if ax is axes[0][0]:
            ax.set_ylabel("peak lr")
        ax.set_title(f"{group}: final eval loss", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8)
    return fig


def hybrid(tables):
    """Admin's hybrid table (Liu et al. 2020, arXiv 2004.08249, Sec. 3): Post-LN with warm-up,
    Pre-LN and the two hybrids (a Post-LN encoder under a Pre-LN decoder, and the reverse).
    Left: the final eval loss of every run (a dot per seed, the bar the mean) at each depth,
    against the chance loss; right: the eval loss over the steps at the largest depth, a
    line per run."""
    runs, metrics = tables["runs"], tables["metrics"]
    if runs.empty or metrics.empty:
        return None
    groups, depths = ordered_groups(runs.group), sorted(runs.depth.unique())
    fig, (left, right) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.4, FIGSIZE_PER_PANEL[1] * 1.1))
    width = 0.8 / len(groups)
    for k, group in enumerate(groups):
        for d, depth in enumerate(depths):
            cell = runs[(runs.group == group) & (runs.depth == depth)]
            x = d + (k - (len(groups) - 1) / 2) * width
            losses = cell.final_eval_loss.dropna()
            if len(losses):
                left.bar(x, losses.mean(), width * 0.9, color=group_color(group), alpha=0.5,
                         label=group if d == 0 else None)
                left.scatter([x] * len(losses), losses, color=group_color(group), s=10, zorder=3)
            for _ in cell[cell.status == "diverged"].itertuples():
                left.text(x, 0.02, "div", ha="center", fontsize=6, color="red")
    chance = runs.chance_loss.dropna()
    if len(chance):
        left.axhline(chance.iloc[0], color="grey", ls=":", lw=1, label="chance")
    left.set_xticks(range(len(depths)), [f"{d}L-{d}L" for d in depths])
    left.set_ylabel("final eval loss")
    left.set_title("final eval loss, a dot per seed")
    left.legend(fontsize=7)
    deepest = max(depths)
    evals = metrics[(metrics.depth == deepest)].dropna(subset=["eval_loss"])
    for run, rows in evals.groupby("run"):
        group = rows.group.iloc[0]
        right.plot(rows.step, rows.eval_loss, color=group_color(group), lw=1, alpha=0.8)
    for group in groups:
        right.plot([], [], color=group_color(group), label=group)
    right.set_yscale("log")
    right.set_xlabel("step")
    right.set_ylabel("eval loss")
    right.set_title(f"{deepest}L-{deepest}L, a line per run")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def rezero(tables):
    """ReZero against Post-LN and Admin on translation (Transformer-Clinic's iwslt14_de-en.md:
    ReZero and ReZero-Post-LN 1-2 BLEU below the other 6L-6L models): test BLEU of every
    run, a dot per seed, the bar the mean; beside it the validation BLEU over the updates."""
    runs, metrics = tables["runs"], tables["metrics"]
    if runs.empty or "test_bleu" not in runs or runs.test_bleu.isna().all():
        return None
    groups = ordered_groups(runs.group)
    fig, (left, right) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1]))
    for k, group in enumerate(groups):
        bleu = runs[runs.group == group].test_bleu.dropna()
        left.bar(k, bleu.mean(), 0.6, color=group_color(group), alpha=0.5)
        left.scatter([k] * len(bleu), bleu, color=group_color(group), s=12, zorder=3)
        left.text(k, bleu.mean(), f"{bleu.mean():.2f}", ha="center", va="bottom", fontsize=7)
    left.set_xticks(range(len(groups)), groups, fontsize=7)
    left.set_ylabel("test BLEU")
    left.set_title(f"{int(runs.depth.iloc[0])}L-{int(runs.depth.iloc[0])}L, a dot per seed")
    if "valid_bleu" in metrics:
        for run, rows in metrics.dropna(subset=["valid_bleu"]).groupby("run"):
            right.plot(rows.step, rows.valid_bleu, color=group_color(rows.group.iloc[0]), lw=1, alpha=0.8)
    for group in groups:
        right.plot([], [], color=group_color(group), label=group)
    right.set_xlabel("update")
    right.set_ylabel("validation BLEU")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def output_change(tables):
    """Admin Theorem 2 / Fig. 4 (Liu et al. 2020): the output change |F(x,W) − F(x,W+δ)|^2 at
    init under δ = 1e-4·sign(N(0,1)) against the number of residual sublayers (left: every
    seed as a point, the linear and the log fit of each group with its R^2), and, as
    Transformer-Clinic does, the change of each sublayer's std-normalised input along the
    deepest model (right)."""
    if tables["metrics"].empty or tables["layers"].empty:
        return None
    table = output_change_table(tables["metrics"], tables["layers"])
    if table.empty:
        return None
    fits = output_change_fits(table).set_index("group") if table.sublayers.nunique() >= 3 else None
    fig, (left, right) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1] * 1.2))
    grid = np.linspace(table.sublayers.min(), table.sublayers.max(), 200)
    for group in ordered_groups(table.group):
        rows = table[table.group == group]
        color = group_color(group)
        left.scatter(rows.sublayers, rows.output_change, s=12, color=color, label=group)
        if fits is not None and group in fits.index:
            f = fits.loc[group]
            left.plot(grid, f.linear_intercept + f.linear_slope * grid, color=color, ls="-", lw=1,
                      label=f"  linear fit, R²={f.linear_r2:.3f}")
            left.plot(grid, f.log_intercept + f.log_slope * np.log(grid), color=color, ls=":", lw=1.4,
                      label=f"  log fit, R²={f.log_r2:.3f}")
    left.set_yscale("log")
    left.set_xlabel("residual sublayers (2 N encoder + 3 N decoder)")
    left.set_ylabel("output change |F(x,W) − F(x,W+δ)|² per token")
    left.set_title("output change at init")
    left.legend(fontsize=6, ncol=1)

    layers = tables["layers"]
    deepest = layers[(layers.step == 0) & (layers.depth == layers.depth.max())].dropna(subset=["input_change"])
    for group in ordered_groups(deepest.group):
        rows = deepest[deepest.group == group].copy()
        rows["index"] = rows.groupby("run").cumcount() + 1  # sublayer position, bottom up
        mean = rows.groupby("index").input_change.mean()
        right.plot(mean.index, mean.values, color=group_color(group), lw=1.2, label=group)
    right.set_yscale("log")
    right.set_xlabel("sublayer (encoder, then decoder)")
    right.set_ylabel("change of the sublayer's normalised input")
    right.set_title(f"along the {int(layers.depth.max())}L-{int(layers.depth.max())}L model (mean over seeds)")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig
