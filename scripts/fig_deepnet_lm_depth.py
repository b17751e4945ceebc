"""DeepNet Fig. 6's methods on a language model: final validation loss against depth, a line
per method (decoder-only, the built-in text). Preset: deepnet_lm_depth; `--cells
docs/data/deepnet_cells.csv` draws the committed cells of the lm_depth recipe."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, cells_main, group_color, ordered_groups

EXPERIMENT, RECIPE = "deepnet_lm_depth", "lm_depth"


def draw(cells, curves):
    cells = cells[(cells.setting == "") & (cells.status == "completed")]
    if cells.empty:
        return None
    fig, ax = plt.subplots(figsize=(FIGSIZE_PER_PANEL[0] * 1.3, FIGSIZE_PER_PANEL[1] * 1.1))
    for group in ordered_groups(cells.group):
        rows = cells[cells.group == group].groupby("depth").final_eval_loss.mean()
        ax.plot(rows.index, rows.values, "o-", color=group_color(group), label=group, ms=4, lw=1.2)
    ax.set_xscale("log")
    ax.set_xticks(sorted(cells.depth.unique()), [str(d) for d in sorted(cells.depth.unique())])
    ax.minorticks_off()
    ax.set_xlabel("layers (decoder-only)")
    ax.set_ylabel("final validation loss")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return cells_main("deepnet_lm_depth", EXPERIMENT, RECIPE, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
