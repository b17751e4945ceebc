"""DeepNet Fig. 4 (Wang et al. 2022, arXiv v1), its gradient panel: the gradient norm of each layer's parameters at step 1
(a layer's sublayers combined in quadrature), encoder and decoder, a line per group: Post-LN's
decoder gradient vanishes towards the bottom. Preset: deepnet_early."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, run_labels, run_order

EXPERIMENT = "deepnet_early"
STEP = 1


def draw(tables):
    layers = tables["layers"]
    if layers.empty:
        return None
    data = layers[layers.step == STEP].dropna(subset=["grad_norm"])
    if data.empty:
        return None
    data = data.assign(sq=data.grad_norm ** 2)
    per_layer = data.groupby(["run", "group", "stack", "layer"], as_index=False).sq.sum()
    per_layer["grad_norm"] = np.sqrt(per_layer.sq)
    labels = run_labels(per_layer)
    fig, axes = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2, FIGSIZE_PER_PANEL[1]))
    for ax, stack in zip(axes, ("encoder", "decoder")):
        for run in run_order(per_layer):
            rows = per_layer[(per_layer.run == run) & (per_layer["stack"] == stack)].sort_values("layer")
            ax.plot(rows.layer, rows.grad_norm, marker="o", ms=3, color=group_color(rows.group.iloc[0]),
                    label=labels[run])
        ax.set_yscale("log")
        ax.set_title(f"{stack}, step {STEP}")
        ax.set_xlabel("layer (1 = bottom)")
        ax.set_ylabel("gradient norm")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("grad_norm_by_layer", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
