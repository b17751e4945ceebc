"""A 1,000-layer decoder-only LM: training and eval loss and the model update, a line per group.
Preset: lm_1000_layers."""

import sys

from stabexp.plotting.figures import figure_main, training_curves

EXPERIMENT = "lm_1000_layers"


def draw(tables):
    return training_curves(tables, "1,000-layer decoder-only LM, 64-128-2, the built-in text")


def main(argv=None) -> int:
    return figure_main("lm_1000_layers", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
