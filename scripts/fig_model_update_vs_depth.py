"""DeepNet Fig. 4/5 (Wang et al. 2022): the early model update ||F(x,θ_i) − F(x,θ_0)|| of
64-128-2 models against depth, a line per group, a panel per step: Post-LN's grows with depth,
DeepNorm's stays nearly constant. Preset deepnet_depth (steps 1, 10, 100), and the depth_table
runs of every Table 1 group (steps 1, 10, 100: that preset probes them too)."""

import sys

from stabexp.plotting.figures import figure_main, update_vs_depth

FIGURES = {"deepnet_depth": "model_update_vs_depth", "depth_table": "model_update_vs_depth_table1"}


def draw(tables):
    return update_vs_depth(tables["metrics"])


def draw_table1(tables):
    # depth_table probes steps 1-10 and every 100 of 300: the early update is step 100's.
    return update_vs_depth(tables["metrics"], last=min(100, int(tables["metrics"].step.max())))


def main(argv=None) -> int:
    figure_main(FIGURES["deepnet_depth"], "deepnet_depth", draw, argv)
    figure_main(FIGURES["depth_table"], "depth_table", draw_table1, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
