"""LR sensitivity in the style of Wortsman et al. 2023 (arXiv 2309.14322) Fig. 1 / 3 (the
panels of fig_lr_sensitivity.py) for Muon on the Pre-LN LM with QK-Clip off (tau 0) and at tau 100, a line per setting and seed. Preset: lr_sensitivity_muon."""

import sys

from stabexp.plotting.figures import figure_main, lr_sensitivity_figure

EXPERIMENT = "lr_sensitivity_muon"


def main(argv=None) -> int:
    return figure_main("lr_sensitivity_muon", EXPERIMENT, lr_sensitivity_figure, argv)


if __name__ == "__main__":
    sys.exit(main())
