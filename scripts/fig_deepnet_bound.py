"""DeepNet Theorem 4.1 measured: left, the bound sum_i sqrt(v_i^2 + w_i^2) / alpha ||dtheta_i||
(solid) and the model update relative to ||F(x, theta_0)|| (dashed) over the steps of the deepest
runs; right, both at step 1 against depth (where every depth's sublayers moved alike), a line per
group. Preset: deepnet_bound."""

import sys

import matplotlib.pyplot as plt

from stabexp.analysis import update_bound_steps
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "deepnet_bound"


def draw(tables):
    steps = update_bound_steps(tables["metrics"], tables["update_bound"], tables["runs"])
    if steps.empty:
        return None
    fig, (over, depth) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1]))
    deepest = steps[steps.depth == steps.depth.max()]
    first = steps[steps.step == steps.step.min()]
    for group in ordered_groups(steps.group):
        color = group_color(group)
        rows = deepest[deepest.group == group].groupby("step")[["bound", "measured"]].mean()
        over.plot(rows.index, rows.bound, "-", color=color, label=f"{group} bound")
        over.plot(rows.index, rows.measured, "--", color=color, label=f"{group} measured")
        at_end = first[first.group == group].groupby("depth")[["bound", "measured"]].mean()
        depth.plot(at_end.index, at_end.bound, "o-", color=color, label=f"{group} bound", ms=4)
        depth.plot(at_end.index, at_end.measured, "s--", color=color, mfc="none", label=f"{group} measured", ms=4)
    over.set_title(f"{int(steps.depth.max())} layers", fontsize=9)
    over.set_xlabel("step")
    depth.set_xlabel("layers")
    depth.set_title(f"at step {int(first.step.min())}", fontsize=9)
    over.set_xscale("log")
    for ax in (over, depth):
        ax.set_yscale("log")
        ax.set_ylabel("model update / ||F(x, theta_0)||")
        ax.legend(fontsize=6)
    depth.set_xscale("log")
    depths = sorted(steps.depth.unique())
    depth.set_xticks(depths, [str(int(d)) for d in depths])
    depth.minorticks_off()
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("deepnet_bound", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
