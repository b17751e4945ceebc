"""The stabilisers of 2024-2025 against depth ("The Curse of Depth" Fig. 2, Mix-LN Fig. 1,
Peri-LN's hidden-state norm): per depth above the shallowest, the eval-loss increase of skipping
each layer at the end of training against the layer's position, a line per group (mean over
seeds); last panel, the residual stream's norm per token entering each sublayer at the last probe
step of the deepest runs. Preset: curse_of_depth."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "curse_of_depth"


def draw(tables):
    importance, layers = tables["layer_importance"], tables["layers"]
    if importance.empty:
        return None
    last = importance[(importance.step == importance.groupby("run").step.transform("max")) & (importance.step > 0)]
    depths = sorted(d for d in last.depth.unique() if d > last.depth.min()) or [last.depth.max()]
    fig, axes = plt.subplots(1, len(depths) + 1, figsize=(FIGSIZE_PER_PANEL[0] * (len(depths) + 1), FIGSIZE_PER_PANEL[1]))
    for ax, depth in zip(axes, depths):
        here = last[last.depth == depth]
        for group in ordered_groups(here.group):
            curve = here[here.group == group].groupby("layer").loss_increase.mean()
            ax.plot(curve.index, curve.values, "o-", ms=3, lw=1.2, color=group_color(group), label=group)
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_xlabel("layer skipped")
        ax.set_ylabel("eval-loss increase (nats)")
        ax.set_title(f"{int(depth)} layers, after training", fontsize=9)
    axes[0].legend(fontsize=6)
    stream = layers.dropna(subset=["stream_norm"]) if "stream_norm" in layers else layers.iloc[:0]
    deepest = stream[(stream.depth == stream.depth.max()) & (stream.step == stream.groupby("run").step.transform("max"))]
    ax = axes[-1]
    for group in ordered_groups(deepest.group):
        rows = deepest[deepest.group == group].copy()
        rows["position"] = rows.groupby("run").cumcount() + 1
        curve = rows.groupby("position").stream_norm.mean()
        ax.plot(curve.index, curve.values, "-", lw=1.2, color=group_color(group), label=group)
    ax.set_yscale("log")
    ax.set_xlabel("sublayer (bottom to top)")
    ax.set_ylabel("residual stream norm per token")
    if len(deepest):
        ax.set_title(f"{int(deepest.depth.max())} layers, last probe step", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("curse_of_depth", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
