"""Wortsman et al. 2023 (arXiv 2309.14322) Fig. 1 / 3 style: (left) final validation loss
against the learning rate, a line per setting (qk-layernorm, z-loss), a diverged run drawn at the
loss at init; (middle) the largest attention logit over all layers against the step, and (right)
the largest output log Z, both at the two highest learning rates of the grid. Preset: lr_sensitivity."""

import sys

from stabexp.plotting.figures import figure_main, lr_sensitivity_figure

EXPERIMENT = "lr_sensitivity"


def main(argv=None) -> int:
    return figure_main("lr_sensitivity", EXPERIMENT, lr_sensitivity_figure, argv)


if __name__ == "__main__":
    sys.exit(main())
