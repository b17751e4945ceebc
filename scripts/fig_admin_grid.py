"""Admin's (lr, beta2) grid without warm-up (Liu et al. 2020; Transformer-Clinic's
iwslt14_de-en.md, "No Warmup"): a panel per group, a cell per lr and beta2, the final eval loss
(colour, log scale) or "div" where the run diverged. Preset: admin_grid."""

import sys

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, ordered_groups

EXPERIMENT = "admin_grid"


def beta2(overrides) -> str:
    for part in str(overrides).split("__"):
        if part.startswith("optim.betas="):
            return part.split(",")[-1].rstrip("]")
    return "?"


def draw(tables):
    runs = tables["runs"]
    if runs.empty or runs.lr.nunique() < 2:
        return None
    runs = runs.assign(beta2=runs.overrides.map(beta2))
    groups, lrs, b2s = ordered_groups(runs.group), sorted(runs.lr.unique()), sorted(runs.beta2.unique())
    fig, axes = plt.subplots(1, len(groups), squeeze=False, sharey=True, layout="constrained",
                             figsize=(FIGSIZE_PER_PANEL[0] * 0.8 * len(groups), FIGSIZE_PER_PANEL[1] * 1.2))
    done = runs[runs.status == "completed"].final_eval_loss
    norm = LogNorm(vmin=max(done.min(), 1e-4), vmax=max(done.max(), done.min() * 10)) if len(done) else None
    image = None
    for ax, group in zip(axes[0], groups):
        grid = np.full((len(lrs), len(b2s)), np.nan)
        for _, r in runs[runs.group == group].iterrows():
            i, j = lrs.index(r.lr), b2s.index(r.beta2)
            if r.status == "completed":
                grid[i, j] = r.final_eval_loss
                dark = norm is not None and norm(r.final_eval_loss) > 0.6  # viridis_r: dark at high loss
                ax.text(j, i, f"{r.final_eval_loss:.2g}", ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
            else:
                ax.text(j, i, "div" if r.status == "diverged" else str(r.status), ha="center", va="center",
                        fontsize=6, color="red")
        image = ax.imshow(grid, norm=norm, cmap="viridis_r", aspect="auto", origin="lower")
        ax.set_xticks(range(len(b2s)), b2s, fontsize=7)
        ax.set_yticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.set_xlabel("beta2")
        if ax is axes[0][0]:
            ax.set_ylabel("peak lr")
        ax.set_title(f"{group}: final eval loss", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8)
    return fig


def main(argv=None) -> int:
    return figure_main("admin_grid", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
