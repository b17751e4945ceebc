"""Admin's residual dependency (Liu et al. 2020, arXiv 2004.08249, Sec. 4.1), drawn as
Transformer-Clinic's img/6_layer_dependency.png and 18_layer_dependency.png: for each encoder
sublayer i (row) the share beta_ij of its output that comes from the embedding (j = 0) and each
branch j <= i (columns), at init and at the end of training, a row of panels per group, a pair
of columns per depth; the norms' bias part is left out. Preset: admin_dependency."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, ordered_groups

EXPERIMENT = "admin_dependency"


def draw(tables):
    dep = tables.get("dependency")
    if dep is None or dep.empty:
        return None
    dep = dep[(dep["stack"] == "encoder") & (dep.component >= 0)]
    if dep.empty:
        return None
    last = dep.groupby("run").step.transform("max")
    dep = dep.assign(when=np.where(dep.step == 0, "init", np.where(dep.step == last, "end", "")))
    groups, depths = ordered_groups(dep.group), sorted(dep.depth.unique())
    columns = [(d, w) for d in depths for w in ("init", "end")]
    fig, axes = plt.subplots(len(groups), len(columns), squeeze=False, layout="constrained",
                             figsize=(FIGSIZE_PER_PANEL[0] * 0.75 * len(columns), FIGSIZE_PER_PANEL[1] * 0.9 * len(groups)))
    image = None
    for r, group in enumerate(groups):
        for c, (depth, when) in enumerate(columns):
            ax = axes[r][c]
            rows = dep[(dep.group == group) & (dep.depth == depth) & (dep.when == when)]
            if rows.empty:
                ax.axis("off")
                continue
            n = int(rows.sublayer.max())
            grid = np.full((n, n + 1), np.nan)
            for (i, j), value in rows.groupby(["sublayer", "component"]).beta.mean().items():
                grid[int(i) - 1, int(j)] = value
            # Rows are sublayers 1..n from the top, columns components 0..n.
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto",
                              extent=(-0.5, n + 0.5, n + 0.5, 0.5))
            ax.set_title(f"{group}, {depth}L, {when}", fontsize=8)
            if r == len(groups) - 1:
                ax.set_xlabel("component j (0: embedding)", fontsize=7)
            if c == 0:
                ax.set_ylabel("sublayer i", fontsize=7)
            ax.tick_params(labelsize=6)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="beta_ij")
    return fig


def main(argv=None) -> int:
    return figure_main("admin_dependency", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
