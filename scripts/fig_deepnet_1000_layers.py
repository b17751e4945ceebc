"""DeepNet's title: training and eval loss and the model update of 500L-500L models (2,500
sublayers), a line per group. Preset: deepnet_1000_layers."""

import sys

from stabexp.plotting.figures import figure_main, training_curves

EXPERIMENT = "deepnet_1000_layers"


def draw(tables):
    return training_curves(tables, "500L-500L, 64-128-2, sort task")


def main(argv=None) -> int:
    return figure_main("deepnet_1000_layers", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
