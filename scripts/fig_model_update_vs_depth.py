"""DeepNet Fig. 4 (Wang et al. 2022): the early model update ||F(x,θ_i) − F(x,θ_0)|| of 64-128-2
models against depth, a line per group, a panel per step (1, 10 and the last): Post-LN's grows
with depth, DeepNorm's stays nearly constant. Preset: deepnet_depth."""

import sys

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "deepnet_depth"


def draw(tables):
    data = tables["metrics"].dropna(subset=["model_update"])
    if data.empty or data.depth.nunique() < 2:
        return None
    steps = sorted({1, 10, int(data.step.max())} & set(data.step.unique()))
    fig, axes = plt.subplots(1, len(steps), squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * len(steps), FIGSIZE_PER_PANEL[1]))
    for ax, step in zip(axes[0], steps):
        at_step = data[data.step == step]
        for group in ordered_groups(at_step.group):
            rows = at_step[at_step.group == group].groupby("depth").model_update.mean()
            ax.plot(rows.index, rows.values, marker="o", ms=4, color=group_color(group), label=group)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted(data.depth.unique()), [str(d) for d in sorted(data.depth.unique())])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("depth N (N L-N L)")
        ax.set_ylabel("model update ||F(x,θ_i) − F(x,θ_0)||")
        ax.set_title(f"step {step}")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("model_update_vs_depth", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
