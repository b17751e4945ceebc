"""Admin's Theorem 1 (Liu et al. 2020, arXiv 2004.08249, Sec. 3): the gradient of every
sublayer's output at init, relative to the largest in the network, along the encoder and then
the decoder; a panel per depth, a line per group (mean over seeds, the band its min-max), the
decoder's cross-attention sublayers marked. Post-LN's decoder vanishes toward the bottom, its
encoder and Pre-LN do not; the hybrids show which stack carries it. Preset: admin_grad_vanishing."""

import sys

import matplotlib.pyplot as plt

from stabexp.analysis import output_gradients
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "admin_grad_vanishing"


def draw(tables):
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


def main(argv=None) -> int:
    return figure_main("admin_grad_vanishing", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
