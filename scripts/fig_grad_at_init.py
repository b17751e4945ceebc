"""Gradients at initialisation against depth (Xiong et al. 2020, arXiv 2002.04745, Sec. 3):
left, the gradient norm of each layer along the deepest models; middle, the gradient of the
last decoder FFN's W_2 against depth on log-log axes with each group's slope (Post-LN: flat,
Pre-LN: ~1/sqrt(L), slope -1/2); right, Pre-LN's E||x_l||^2 along the stack, which Xiong et al.
show grows linearly in l. Preset: grad_at_init."""

import sys

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from stabexp.analysis import last_w2_grad, w2_grad_slopes
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "grad_at_init"


def draw(tables):
    layers = tables["layers"]
    if layers.empty:
        return None
    at_init = layers[layers.step == 0].dropna(subset=["grad_norm"])
    w2 = last_w2_grad(layers)
    if at_init.empty or w2.empty:
        return None
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1]))
    deepest = int(at_init.depth.max())
    rows = at_init[at_init.depth == deepest].assign(sq=lambda f: f.grad_norm ** 2)
    per_layer = rows.groupby(["run", "group", "stack", "layer"], as_index=False).sq.sum()
    per_layer["position"] = per_layer.layer + np.where(per_layer["stack"] == "decoder", deepest, 0)
    for group in ordered_groups(per_layer.group):
        mean = per_layer[per_layer.group == group].groupby("position").sq.mean().pow(0.5)
        left.plot(mean.index, mean.values, color=group_color(group), lw=1.2, label=group)
    left.axvline(deepest + 0.5, color="grey", lw=0.8)
    left.set_yscale("log")
    left.set_xlabel(f"layer (1-{deepest} encoder, then decoder)")
    left.set_ylabel("gradient norm at init")
    left.set_title(f"{deepest}L-{deepest}L, mean over seeds")
    left.legend(fontsize=7)

    slopes = w2_grad_slopes(w2).set_index("group")
    for group in ordered_groups(w2.group):
        rows = w2[w2.group == group]
        middle.scatter(rows.depth, rows.w2_grad_norm, s=10, color=group_color(group))
        mean = rows.groupby("depth").w2_grad_norm.mean()
        label = group + (f", slope {slopes.loc[group, 'slope']:+.2f}" if group in slopes.index else "")
        middle.plot(mean.index, mean.values, color=group_color(group), lw=1.2, label=label)
    depths = sorted(w2.depth.unique())
    middle.set_xscale("log")
    middle.set_yscale("log")
    middle.set_xticks(depths, [str(d) for d in depths])
    middle.xaxis.set_minor_formatter(NullFormatter())
    middle.set_xlabel("depth N (N L-N L)")
    middle.set_ylabel("||∂L/∂W_2|| of the last decoder FFN")
    middle.set_title("last-layer W_2 gradient at init")
    middle.legend(fontsize=7)

    preln = layers[(layers.step == 0) & (layers.group == "preln") & (layers.depth == deepest)]
    preln = preln.dropna(subset=["ln_input_norm"])
    for stack, ls in (("encoder", "-"), ("decoder", "--")):
        rows = preln[preln["stack"] == stack].copy()
        if rows.empty:
            continue
        rows["index"] = rows.groupby("run").cumcount() + 1
        mean = rows.groupby("index").ln_input_norm.apply(lambda v: (v ** 2).mean())
        right.plot(mean.index, mean.values, color=group_color("preln"), ls=ls, lw=1.2, label=f"preln {stack}")
    right.set_xlabel("sublayer along the stack")
    right.set_ylabel("||x_l||² per token (LN input)")
    right.set_title(f"Pre-LN residual stream at init, {deepest}L")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("grad_at_init", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
