"""Admin Theorem 2 / Fig. 4 (Liu et al. 2020): the output change |F(x,W) − F(x,W+δ)|^2 at init
under δ = 1e-4·sign(N(0,1)) against the number of residual sublayers (left: every seed as a
point, the linear and the log fit of each group with its R^2), and, as Transformer-Clinic does,
the change of each sublayer's std-normalised input along the deepest model (right).
Preset: admin_output_change."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.analysis import output_change_fits, output_change_table
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "admin_output_change"


def draw(tables):
    if tables["metrics"].empty or tables["layers"].empty:
        return None
    table = output_change_table(tables["metrics"], tables["layers"])
    if table.empty:
        return None
    fits = output_change_fits(table).set_index("group") if table.sublayers.nunique() >= 3 else None
    fig, (left, right) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1] * 1.2))
    grid = np.linspace(table.sublayers.min(), table.sublayers.max(), 200)
    for group in ordered_groups(table.group):
        rows = table[table.group == group]
        color = group_color(group)
        left.scatter(rows.sublayers, rows.output_change, s=12, color=color, label=group)
        if fits is not None and group in fits.index:
            f = fits.loc[group]
            left.plot(grid, f.linear_intercept + f.linear_slope * grid, color=color, ls="-", lw=1,
                      label=f"  linear fit, R²={f.linear_r2:.3f}")
            left.plot(grid, f.log_intercept + f.log_slope * np.log(grid), color=color, ls=":", lw=1.4,
                      label=f"  log fit, R²={f.log_r2:.3f}")
    left.set_yscale("log")
    left.set_xlabel("residual sublayers (2 N encoder + 3 N decoder)")
    left.set_ylabel("output change |F(x,W) − F(x,W+δ)|² per token")
    left.set_title("output change at init")
    left.legend(fontsize=6, ncol=1)

    layers = tables["layers"]
    deepest = layers[(layers.step == 0) & (layers.depth == layers.depth.max())].dropna(subset=["input_change"])
    for group in ordered_groups(deepest.group):
        rows = deepest[deepest.group == group].copy()
        rows["index"] = rows.groupby("run").cumcount() + 1  # sublayer position, bottom up
        mean = rows.groupby("index").input_change.mean()
        right.plot(mean.index, mean.values, color=group_color(group), lw=1.2, label=group)
    right.set_yscale("log")
    right.set_xlabel("sublayer (encoder, then decoder)")
    right.set_ylabel("change of the sublayer's normalised input")
    right.set_title(f"along the {int(layers.depth.max())}L-{int(layers.depth.max())}L model (mean over seeds)")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("output_change", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
