"""LR sensitivity in the style of Wortsman et al. 2023 (arXiv 2309.14322) Fig. 1 / 3 (the
panels of fig_lr_sensitivity.py) for Pre-LN, Peri-LN and DyT, a line per group and seed. Preset: lr_sensitivity_2025."""

import sys

from stabexp.plotting.figures import figure_main, lr_sensitivity_figure

EXPERIMENT = "lr_sensitivity_2025"


def main(argv=None) -> int:
    return figure_main("lr_sensitivity_2025", EXPERIMENT, lr_sensitivity_figure, argv)


if __name__ == "__main__":
    sys.exit(main())
