"""The analogue of DeepNet's Table 1 (Wang et al. 2022) as a figure: final eval loss of every
group at every depth after the same step budget, coloured against the chance loss, "diverged @
k" where the loss exploded. `stabexp report` prints the same table as markdown. Preset:
depth_table."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, ordered_groups

EXPERIMENT = "depth_table"


def draw(tables):
    runs = tables["runs"]
    depths = sorted(int(d) for d in runs.depth.unique())
    groups = ordered_groups(runs.group)
    chance = float(runs.chance_loss.dropna().iloc[0]) if runs.chance_loss.notna().any() else np.nan
    values = np.full((len(groups), len(depths)), np.nan)
    fig, ax = plt.subplots(figsize=(FIGSIZE_PER_PANEL[0] * 1.6, FIGSIZE_PER_PANEL[1] * 1.2))
    for i, group in enumerate(groups):
        for j, depth in enumerate(depths):
            cell = runs[(runs.group == group) & (runs.depth == depth)]
            done = cell[cell.status == "completed"]
            diverged = cell[cell.status == "diverged"]
            if not done.empty:
                values[i, j] = done.final_eval_loss.mean()
                text = f"{values[i, j]:.3f}\nacc {done.final_eval_acc.mean():.2f}"
            elif not diverged.empty:
                text = f"diverged\n@ {int(diverged.diverged_at_step.min())}"
            else:
                text = "-"
            dark = np.isfinite(values[i, j]) and np.isfinite(chance) and values[i, j] > 0.6 * chance
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    image = ax.imshow(values, cmap="viridis_r", vmin=0, vmax=chance if np.isfinite(chance) else None,
                      aspect="auto")
    fig.colorbar(image, ax=ax, label=f"final eval loss (chance {chance:.2f})")
    ax.set_xticks(range(len(depths)), [f"{d}L-{d}L" for d in depths])
    ax.set_yticks(range(len(groups)), groups)
    steps = int(runs.steps_done.max()) if runs.steps_done.notna().any() else 0
    ax.set_title(f"after {steps} steps (grey: diverged)")
    ax.set_facecolor("0.85")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("depth_table", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
