"""DeepNet Fig. 8 (Wang et al. 2022) at tiny scale: final validation loss of decoder-only LMs
against log(depth), DeepNorm and Pre-LN, with the least-squares line A ln(depth) + B of each
(stabexp.analysis.depth_law). Preset: deepnet_depth_law; `--cells docs/data/deepnet_cells.csv`
draws the committed cells of the lm_depth recipe."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.analysis import depth_law
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, cells_main, group_color

EXPERIMENT, RECIPE = "deepnet_depth_law", "lm_depth"


def draw(cells, curves):
    cells = cells[(cells.setting == "") & cells.group.isin(["deepnorm", "preln"])]
    law = depth_law(cells)
    if law.empty:
        return None
    fig, ax = plt.subplots(figsize=(FIGSIZE_PER_PANEL[0] * 1.3, FIGSIZE_PER_PANEL[1] * 1.1))
    for _, fit in law.iterrows():
        rows = cells[(cells.group == fit.group) & (cells.status == "completed")].groupby("depth").final_eval_loss.mean()
        color = group_color(fit.group)
        ax.plot(rows.index, rows.values, "o", color=color, ms=5)
        x = np.geomspace(rows.index.min(), rows.index.max(), 50)
        ax.plot(x, fit.A * np.log(x) + fit.B, "-", color=color, lw=1,
                label=f"{fit.group}: {fit.A:+.3f} ln(depth) + {fit.B:.2f}, R$^2$ {fit.r2:.2f}")
    depths = sorted(cells.depth.unique())
    ax.set_xscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set_xlabel("layers (decoder-only)")
    ax.set_ylabel("final validation loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return cells_main("deepnet_depth_law", EXPERIMENT, RECIPE, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
