"""DeepNet Theorem 4.1 measured: left, the bound sum_i sqrt(v_i^2 + w_i^2) / alpha ||dtheta_i||
(solid) and the model update relative to ||F(x, theta_0)|| (dashed) over the steps of the deepest
runs; right, both at step 1 against depth (where every depth's sublayers moved alike), a line per
group. Preset: deepnet_bound."""

import sys

from stabexp.plotting.figures import figure_main, update_bound_figure

EXPERIMENT = "deepnet_bound"


def main(argv=None) -> int:
    return figure_main("deepnet_bound", EXPERIMENT, update_bound_figure, argv)


if __name__ == "__main__":
    sys.exit(main())
