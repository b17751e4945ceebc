"""DeepNet Fig. 4 (Wang et al. 2022, arXiv v1), its LN-input panels: the norm of LayerNorm inputs over the first steps,
encoder and decoder (mean over a stack's sublayers), a line per group, against sqrt(d): a
LayerNorm output has norm sqrt(d), so an input far above it is what the LN divides down.
Preset: deepnet_early."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, run_labels, run_order

EXPERIMENT = "deepnet_early"


def draw(tables):
    layers = tables["layers"].dropna(subset=["ln_input_norm"])
    if layers.empty:
        return None
    mean = layers.groupby(["run", "group", "stack", "step"], as_index=False).ln_input_norm.mean()
    labels = run_labels(mean)
    fig, axes = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2, FIGSIZE_PER_PANEL[1]))
    for ax, stack in zip(axes, ("encoder", "decoder")):
        for run in run_order(mean):
            rows = mean[(mean.run == run) & (mean["stack"] == stack)]
            ax.plot(rows.step, rows.ln_input_norm, color=group_color(rows.group.iloc[0]), lw=1.4,
                    label=labels[run])
        d_model = tables["runs"].get("d_model")
        if d_model is not None and d_model.notna().any():
            ax.axhline(np.sqrt(d_model.dropna().iloc[0]), color="k", ls="--", lw=1,
                       label=f"sqrt(d) = {np.sqrt(d_model.dropna().iloc[0]):.1f}")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("mean ||LN input|| per token")
        ax.set_title(f"{stack}")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("ln_input_norm", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
