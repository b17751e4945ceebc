"""The analogue of DeepNet's Table 1 (Wang et al. 2022) as a figure: every group at every depth
after the same update budget, "diverged @ k" where the loss exploded. On the synthetic task
(preset depth_table) a cell is the final eval loss, coloured against the chance loss; on
Multi30k (preset multi30k_table) it is the test BLEU, with the final validation loss below it.
`stabexp report` prints the same tables as markdown."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, ordered_groups

FIGURES = {"depth_table": "depth_table", "multi30k_table": "depth_table_multi30k"}  # preset: figure


def draw(tables):
    runs = tables["runs"]
    translation = "test_bleu" in runs and runs.test_bleu.notna().any()
    depths = sorted(int(d) for d in runs.depth.unique())
    groups = ordered_groups(runs.group)
    chance = float(runs.chance_loss.dropna().iloc[0]) if runs.chance_loss.notna().any() else np.nan
    values = np.full((len(groups), len(depths)), np.nan)
    height = max(FIGSIZE_PER_PANEL[1] * 1.2, 0.45 * len(groups) + 1.2)  # two text lines a cell
    fig, ax = plt.subplots(figsize=(FIGSIZE_PER_PANEL[0] * 1.6, height))
    for i, group in enumerate(groups):
        for j, depth in enumerate(depths):
            cell = runs[(runs.group == group) & (runs.depth == depth)]
            done = cell[cell.status == "completed"]
            diverged = cell[cell.status == "diverged"]
            if not done.empty and translation:
                values[i, j] = done.test_bleu.mean()
                text = f"BLEU {values[i, j]:.1f}\nloss {done.final_eval_loss.mean():.2f}"
            elif not done.empty:
                values[i, j] = done.final_eval_loss.mean()
                text = f"{values[i, j]:.3f}\nacc {done.final_eval_acc.mean():.2f}"
            elif not diverged.empty:
                text = f"diverged\n@ {int(diverged.diverged_at_step.min())}"
            else:
                text = "-"
            if translation:
                dark = np.isfinite(values[i, j]) and values[i, j] < 0.4 * np.nanmax(values)
            else:
                dark = np.isfinite(values[i, j]) and np.isfinite(chance) and values[i, j] > 0.6 * chance
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    if translation:
        image = ax.imshow(values, cmap="viridis", vmin=0, aspect="auto")
        label = "test BLEU (sacreBLEU)"
    else:
        image = ax.imshow(values, cmap="viridis_r", vmin=0, vmax=chance if np.isfinite(chance) else None,
                          aspect="auto")
        label = f"final eval loss (chance {chance:.2f})"
    fig.colorbar(image, ax=ax, label=label)
    ax.set_xticks(range(len(depths)), [f"{d}L-{d}L" for d in depths])
    ax.set_yticks(range(len(groups)), groups)
    steps = int(runs.steps_done.max()) if runs.steps_done.notna().any() else 0
    task = f"task {runs.task.dropna().iloc[0]}, " if runs.task.notna().any() else ""
    ax.set_title(f"{task}after {steps} updates (grey: diverged)")
    ax.set_facecolor("0.85")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    for experiment, name in FIGURES.items():
        figure_main(name, experiment, draw, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
