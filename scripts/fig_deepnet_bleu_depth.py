"""DeepNet Fig. 6 (Wang et al. 2022): test BLEU against depth, a line per method. Left: Multi30k
at the tiny width (this tool); right: the paper's IWSLT-14 read-offs (stabexp/paper.py), open
markers. Preset: deepnet_bleu_depth; `--cells docs/data/deepnet_cells.csv` draws the committed
cells of the multi30k_table recipe instead."""

import sys

import matplotlib.pyplot as plt

from stabexp import paper
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, cells_main, group_color, ordered_groups

EXPERIMENT, RECIPE = "deepnet_bleu_depth", "multi30k_table"
# The methods of the preset (DeepNet Fig. 6's that this tool has; R-Fixup is `fixup`).
GROUPS = ("deepnorm", "admin", "postln", "preln", "rezero", "fixup", "t_fixup")


def draw(cells, curves):
    # One seed per cell (seed 0), where a cell also has other seeds (admin_rezero's 6L ones).
    cells = cells[(cells.setting == "") & (cells.seed == 0) & cells.group.isin(GROUPS)].dropna(subset=["test_bleu"])
    if cells.empty:
        return None
    fig, (ours, theirs) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1]))
    groups = ordered_groups(GROUPS)
    for group in groups:
        rows = cells[cells.group == group].groupby("depth").test_bleu.mean()
        if not rows.empty:
            ours.plot(rows.index, rows.values, "o-", color=group_color(group), label=group, ms=4, lw=1.2)
        read = paper.DEEPNET_BLEU_DEPTH.get(group)
        if read:
            theirs.plot(list(read), list(read.values()), "o--", mfc="none", color=group_color(group), label=group,
                        ms=5, lw=0.8)
    ours.set_xlabel("layers per stack (N = M)")
    ours.set_ylabel("test BLEU")
    ours.set_title("Multi30k De-En, 64-128-2, 1000 updates", fontsize=9)
    ours.set_xticks(sorted(cells.depth.unique()))
    theirs.set_xlabel("layers per stack (N = M)")
    theirs.set_title("DeepNet Fig. 6, IWSLT-14 De-En (read off)", fontsize=9)
    for ax in (ours, theirs):
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return cells_main("deepnet_bleu_depth", EXPERIMENT, RECIPE, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
