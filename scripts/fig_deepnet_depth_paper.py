"""DeepNet v1 Fig. 5 (Wang et al. 2022) on real text: the model update ||F(x,θ_i) − F(x,θ_0)|| of
64-128-2 models against depth (6L-6L to 100L-100L), Post-LN against DeepNorm, one run per depth,
a panel per update (1, 10, the last). Open markers and the grey band: values read off the paper's
figure, which does not state its update (stabexp/paper.py). Preset: deepnet_depth_paper."""

import sys

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from stabexp import paper
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "deepnet_depth_paper"


def draw(tables):
    data = tables["metrics"].dropna(subset=["model_update"])
    if data.empty or data.depth.nunique() < 2:
        return None
    steps = sorted({1, 10, int(data.step.max())} & set(data.step.unique()))
    depths = sorted(data.depth.unique())
    fig, axes = plt.subplots(1, len(steps), squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * len(steps), FIGSIZE_PER_PANEL[1]))
    for ax, step in zip(axes[0], steps):
        at_step = data[data.step == step]
        for group in ordered_groups(at_step.group):
            rows = at_step[at_step.group == group].groupby("depth").model_update.mean()
            ax.plot(rows.index, rows.values, marker="o", ms=4, color=group_color(group), label=group)
        points = paper.DEEPNET_DEPTH_UPDATE["postln"]
        ax.plot(list(points), list(points.values()), ls="none", marker="o", mfc="none", ms=7,
                color=group_color("postln_warmup"), label="Post-LN, read off DeepNet Fig. 5")
        low, high = paper.DEEPNET_DEPTH_DEEPNORM_RANGE
        ax.axhspan(low, high, color=group_color("deepnorm"), alpha=0.12, lw=0,
                   label="DeepNorm's range, read off DeepNet Fig. 5")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("layers N = M")
        ax.set_ylabel("model update ||F(x,θ_i) − F(x,θ_0)||")
        ax.set_title(f"after update {step}")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("deepnet_depth_paper", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
