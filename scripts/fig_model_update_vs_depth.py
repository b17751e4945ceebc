"""DeepNet Fig. 4 (Wang et al. 2022): the early model update ||F(x,θ_i) − F(x,θ_0)|| of 64-128-2
models against depth, a line per group, a panel per step (1, 10 and the last): Post-LN's grows
with depth, DeepNorm's stays nearly constant. Preset: deepnet_depth."""

import sys

from stabexp.plotting.figures import figure_main, update_vs_depth

EXPERIMENT = "deepnet_depth"


def draw(tables):
    return update_vs_depth(tables["metrics"])


def main(argv=None) -> int:
    return figure_main("model_update_vs_depth", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
