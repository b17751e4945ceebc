"""DeepNet Fig. 4 (Wang et al. 2022, arXiv v1), its model-update panel: the model update ||F(x,θ_i) − F(x,θ_0)|| over the first
steps of 18L-18L models, a line per group; the first 50 steps on the left, the whole run on the
right. Preset: deepnet_early."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, run_labels, run_order

EXPERIMENT = "deepnet_early"


def draw(tables):
    data = tables["metrics"].dropna(subset=["model_update"])
    if data.empty:
        return None
    labels = run_labels(data)
    fig, axes = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2, FIGSIZE_PER_PANEL[1]))
    for ax, last in zip(axes, (50, int(data.step.max()))):
        for run in run_order(data):
            rows = data[(data.run == run) & (data.step >= 1) & (data.step <= last)]
            ax.plot(rows.step, rows.model_update, color=group_color(rows.group.iloc[0]), lw=1.4,
                    label=labels[run])
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("model update ||F(x,θ_i) − F(x,θ_0)||")
        ax.set_title(f"{'/'.join(f'{d}L' for d in sorted(data.depth.unique()))}, steps 1-{last}")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("model_update", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
