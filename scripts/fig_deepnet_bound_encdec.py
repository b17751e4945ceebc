"""DeepNet Theorem 4.3 measured on the encoder-decoder: the panels of fig_deepnet_bound.py, the
bound being the encoder's sum carried by the cross-attentions plus the decoder's terms, against
the model update of the decoder's output. Preset: deepnet_bound_encdec."""

import sys

from stabexp.plotting.figures import figure_main, update_bound_figure

EXPERIMENT = "deepnet_bound_encdec"


def main(argv=None) -> int:
    return figure_main("deepnet_bound_encdec", EXPERIMENT, update_bound_figure, argv)


if __name__ == "__main__":
    sys.exit(main())
