"""The one-off figures of DeepNet (Wang et al. 2022, arXiv 2203.00555): each a function of the
collected tables (or, drawn from cells, of the cells and their curves) returning a figure or None;
the figures table (plotting/table.py) names the preset each draws."""

import matplotlib.pyplot as plt
import numpy as np

from stabexp import analysis, paper
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, group_color, ordered_groups, run_labels, run_order
from stabexp.plotting.kinds import per_layer_grad_norm, update_vs_depth


def early_paper(tables):
    """DeepNet v1 Fig. 4 (Wang et al. 2022) as the paper ran it: 18L-18L d = 512 models, the
    Table 4 recipe, the first 30 updates of the three Post-LN control groups. Left: the
    model update ||F(x,θ_i) − F(x,θ_0)|| per update; middle: the decoder's mean LN input
    norm (per token) for the self-attention and the FFN LayerNorms against sqrt(d); right:
    the decoder's gradient norm per layer (root of the sum of its sublayers' squared norms)
    at the last update. Open markers: values read off the paper's figure (stabexp/paper.py)."""
    metrics = tables["metrics"].dropna(subset=["model_update"])
    layers = tables["layers"]
    if metrics.empty or layers.empty:
        return None
    labels = run_labels(metrics)
    fig, (update_ax, ln_ax, grad_ax) = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1] * 1.1))
    for run in run_order(metrics):
        rows = metrics[metrics.run == run]
        group = rows.group.iloc[0]
        color = group_color(group)
        update_ax.plot(rows.step, rows.model_update, color=color, lw=1.4, label=labels[run])
        decoder = layers[(layers.run == run) & (layers["stack"] == "decoder")]
        if "param" in decoder:
            decoder = decoder[decoder.param.isna()]
        ln = decoder.groupby(["sublayer", "step"]).ln_input_norm.mean()
        for sublayer, style in (("self_attn", "-"), ("ffn", "--")):
            if sublayer in ln.index.get_level_values(0):
                ln_ax.plot(ln[sublayer].index, ln[sublayer].values, color=color, ls=style, lw=1.2,
                           label=f"{labels[run]}, {sublayer} LN")
        last = decoder[decoder.step == decoder.step.max()].assign(sq=lambda r: r.grad_norm ** 2)
        per_layer = np.sqrt(last.groupby("layer").sq.sum())
        grad_ax.plot(per_layer.index, per_layer.values, color=color, lw=1.4, marker=".", label=labels[run])
        for ax, points in ((update_ax, paper.DEEPNET_EARLY_UPDATE), (grad_ax, paper.DEEPNET_EARLY_DECODER_GRAD)):
            if group in points:
                ax.plot(list(points[group]), list(points[group].values()), ls="none", marker="o", mfc="none",
                        color=color, label=f"{group}, read off DeepNet Fig. 4")
    d_model = tables["runs"].d_model.dropna()
    if len(d_model):
        ln_ax.axhline(np.sqrt(d_model.iloc[0]), color="k", ls=":", lw=1, label=f"sqrt(d) = {np.sqrt(d_model.iloc[0]):.1f}")
    depth = int(metrics.depth.max())
    update_ax.set(xlabel="update", ylabel="model update ||F(x,θ_i) − F(x,θ_0)||",
                  title=f"{depth}L-{depth}L, model update")
    ln_ax.set(xlabel="update", ylabel="decoder mean ||LN input|| per token", title="LN inputs (decoder)")
    grad_ax.set(xlabel="decoder layer", ylabel="gradient norm",
                title=f"decoder gradient norm, update {int(layers.step.max())}")
    for ax in (update_ax, ln_ax, grad_ax):
        ax.legend(fontsize=5.5)
    fig.tight_layout()
    return fig


STEP = 1  # the update whose gradients the figure shows


def grad_norm_by_layer(tables):
    """DeepNet Fig. 4 (Wang et al. 2022, arXiv v1), its gradient panel: the gradient norm of
    each layer's parameters at step 1 (a layer's sublayers combined in quadrature), encoder
    and decoder, a line per group: Post-LN's decoder gradient vanishes towards the bottom."""
    layers = tables["layers"]
    if layers.empty:
        return None
    per_layer = per_layer_grad_norm(layers[layers.step == STEP])
    if per_layer.empty:
        return None
    labels = run_labels(per_layer)
    fig, axes = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2, FIGSIZE_PER_PANEL[1]))
    for ax, stack in zip(axes, ("encoder", "decoder")):
        for run in run_order(per_layer):
            rows = per_layer[(per_layer.run == run) & (per_layer["stack"] == stack)].sort_values("layer")
            ax.plot(rows.layer, rows.grad_norm, marker="o", ms=3, color=group_color(rows.group.iloc[0]),
                    label=labels[run])
        ax.set_yscale("log")
        ax.set_title(f"{stack}, step {STEP}")
        ax.set_xlabel("layer (1 = bottom)")
        ax.set_ylabel("gradient norm")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


# The unchanged recipe in grey on every panel, a smaller value in green, larger ones in orange.
BASE, SMALLER, LARGER, LARGEST = "#333333", "#1b9e77", "#d95f02", "#7570b3"
AXES = {"learning rate": {"robustness=lr_x0.5": ("lr x 0.5", SMALLER), "": ("lr 1e-3", BASE),
                          "robustness=lr_x1.5": ("lr x 1.5", LARGER)},
        "batch": {"": ("2048 tokens", BASE), "robustness=batch_x2": ("x 2", LARGER),
                  "robustness=batch_x4": ("x 4", LARGEST)},
        "width": {"": ("64", BASE), "robustness=width_96": ("96", LARGER), "robustness=width_128": ("128", LARGEST)}}
STYLE = {"deepnorm": "-", "postln_init": "--"}


def robustness(cells, curves):
    """DeepNet Fig. 7 (Wang et al. 2022): validation loss over the updates of 18L-18L models
    under one change at a time, a panel per axis (lr, batch, width); DeepNorm solid, Post-
    LN-init dashed. Drawn from cells: the preset's, or the committed curves of the
    multi30k_table recipe."""
    # The unchanged cell is the preset's robustness=base, or where a group has none the recipe's
    # own 18L-18L run (the same settings, run by another preset).
    curves = curves[curves.group.isin(STYLE) & (curves.depth == curves.depth.max())]
    has_base = set(curves[curves.setting == "robustness=base"].group)
    curves = curves[~((curves.setting == "") & curves.group.isin(has_base))]
    curves = curves.assign(setting=curves.setting.replace("robustness=base", ""))
    if curves.empty or curves.setting.nunique() < 2:
        return None
    fig, panels = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1]), sharey=True)
    for ax, (title, variants) in zip(panels, AXES.items()):
        for setting, (label, color) in variants.items():
            for group, style in STYLE.items():
                rows = curves[(curves.setting == setting) & (curves.group == group) & (curves.step > 0)]
                if not rows.empty:
                    ax.plot(rows.step, rows.eval_loss, style, color=color, lw=1.2, label=f"{group}, {label}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("update")
        ax.legend(fontsize=6)
    panels[0].set_ylabel("validation loss")
    fig.tight_layout()
    return fig


# The methods of the preset (DeepNet Fig. 6's that this tool has; R-Fixup is `fixup`).
GROUPS = ("deepnorm", "admin", "postln", "preln", "rezero", "fixup", "t_fixup")


def bleu_depth(cells, curves):
    """DeepNet Fig. 6 (Wang et al. 2022): test BLEU against depth, a line per method. Left:
    Multi30k at the tiny width (this tool); right: the paper's IWSLT-14 read-offs
    (stabexp/paper.py), open markers. Drawn from cells: the preset's, or the committed
    ones of the multi30k_table recipe."""
    # One seed per cell (seed 0), where a cell also has other seeds (admin_rezero's 6L ones).
    cells = cells[(cells.setting == "") & (cells.seed == 0) & cells.group.isin(GROUPS)].dropna(subset=["test_bleu"])
    if cells.empty:
        return None
    fig, (ours, theirs) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1]))
    groups = ordered_groups(GROUPS)
    for group in groups:
        rows = cells[cells.group == group].groupby("depth").test_bleu.mean()
        if not rows.empty:
            ours.plot(rows.index, rows.values, "o-", color=group_color(group), label=group, ms=4, lw=1.2)
        read = paper.DEEPNET_BLEU_DEPTH.get(group)
        if read:
            theirs.plot(list(read), list(read.values()), "o--", mfc="none", color=group_color(group), label=group,
                        ms=5, lw=0.8)
    ours.set_xlabel("layers per stack (N = M)")
    ours.set_ylabel("test BLEU")
    ours.set_title("Multi30k De-En, 64-128-2, 1000 updates", fontsize=9)
    ours.set_xticks(sorted(cells.depth.unique()))
    theirs.set_xlabel("layers per stack (N = M)")
    theirs.set_title("DeepNet Fig. 6, IWSLT-14 De-En (read off)", fontsize=9)
    for ax in (ours, theirs):
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def depth_law(cells, curves):
    """DeepNet Fig. 8 (Wang et al. 2022) at tiny scale: final validation loss of decoder-only
    LMs against log(depth), DeepNorm and Pre-LN, with the least-squares line A ln(depth) + B
    of each (stabexp.analysis.depth_law). Drawn from cells: the preset's, or
    the committed ones of the lm_depth recipe."""
    cells = cells[(cells.setting == "") & cells.group.isin(["deepnorm", "preln"])]
    law = analysis.depth_law(cells)
    if law.empty:
        return None
    fig, ax = plt.subplots(figsize=(FIGSIZE_PER_PANEL[0] * 1.3, FIGSIZE_PER_PANEL[1] * 1.1))
    for _, fit in law.iterrows():
        rows = cells[(cells.group == fit.group) & (cells.status == "completed")].groupby("depth").final_eval_loss.mean()
        color = group_color(fit.group)
        ax.plot(rows.index, rows.values, "o", color=color, ms=5)
        x = np.geomspace(rows.index.min(), rows.index.max(), 50)
        ax.plot(x, fit.A * np.log(x) + fit.B, "-", color=color, lw=1,
                label=f"{fit.group}: {fit.A:+.3f} ln(depth) + {fit.B:.2f}, R$^2$ {fit.r2:.2f}")
    depths = sorted(cells.depth.unique())
    ax.set_xscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set_xlabel("layers (decoder-only)")
    ax.set_ylabel("final validation loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def paper_values(ax):
    """DeepNet v1 Fig. 5's values, read off the paper's figure, which does not state its update
    (stabexp/paper.py): Post-LN's as open markers, DeepNorm's range as a band."""
    points = paper.DEEPNET_DEPTH_UPDATE["postln"]
    ax.plot(list(points), list(points.values()), ls="none", marker="o", mfc="none", ms=7,
            color=group_color("postln_warmup"), label="Post-LN, read off DeepNet Fig. 5")
    low, high = paper.DEEPNET_DEPTH_DEEPNORM_RANGE
    ax.axhspan(low, high, color=group_color("deepnorm"), alpha=0.12, lw=0,
               label="DeepNorm's range, read off DeepNet Fig. 5")


def depth_paper(tables):
    """DeepNet v1 Fig. 5 (Wang et al. 2022) on real text: the model update ||F(x,θ_i) −
    F(x,θ_0)|| of 64-128-2 models against depth (6L-6L to 100L-100L), Post-LN against
    DeepNorm, one run per depth, a panel per update (1, 10, the last), with the paper's values."""
    return update_vs_depth(tables["metrics"], extra=paper_values)
