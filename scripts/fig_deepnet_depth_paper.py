"""DeepNet v1 Fig. 5 (Wang et al. 2022) on real text: the model update ||F(x,θ_i) − F(x,θ_0)|| of
64-128-2 models against depth (6L-6L to 100L-100L), Post-LN against DeepNorm, one run per depth,
a panel per update (1, 10, the last; plotting.figures.update_vs_depth). Open markers and the band: values read off the paper's
figure, which does not state its update (stabexp/paper.py). Preset: deepnet_depth_paper."""

import sys

from stabexp import paper
from stabexp.plotting.figures import figure_main, group_color, update_vs_depth

EXPERIMENT = "deepnet_depth_paper"


def paper_values(ax):
    points = paper.DEEPNET_DEPTH_UPDATE["postln"]
    ax.plot(list(points), list(points.values()), ls="none", marker="o", mfc="none", ms=7,
            color=group_color("postln_warmup"), label="Post-LN, read off DeepNet Fig. 5")
    low, high = paper.DEEPNET_DEPTH_DEEPNORM_RANGE
    ax.axhspan(low, high, color=group_color("deepnorm"), alpha=0.12, lw=0,
               label="DeepNorm's range, read off DeepNet Fig. 5")


def draw(tables):
    return update_vs_depth(tables["metrics"], extra=paper_values)


def main(argv=None) -> int:
    return figure_main("deepnet_depth_paper", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
