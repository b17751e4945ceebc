"""DeepNet v1 Fig. 4 (Wang et al. 2022) as the paper ran it: 18L-18L d = 512 models, the Table 4
recipe, the first 30 updates of the three Post-LN control groups. Left: the model update
||F(x,θ_i) − F(x,θ_0)|| per update; middle: the decoder's mean LN input norm (per token) for the
self-attention and the FFN LayerNorms against sqrt(d); right: the decoder's gradient norm per
layer (root of the sum of its sublayers' squared norms) at the last update. Open markers: values read off the paper's figure (stabexp/paper.py).
Preset: deepnet_early_paper."""

import sys

import matplotlib.pyplot as plt
import numpy as np

from stabexp import paper
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, run_labels, run_order

EXPERIMENT = "deepnet_early_paper"


def draw(tables):
    metrics = tables["metrics"].dropna(subset=["model_update"])
    layers = tables["layers"]
    if metrics.empty or layers.empty:
        return None
    labels = run_labels(metrics)
    fig, (update_ax, ln_ax, grad_ax) = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1] * 1.1))
    for run in run_order(metrics):
        rows = metrics[metrics.run == run]
        group = rows.group.iloc[0]
        color = group_color(group)
        update_ax.plot(rows.step, rows.model_update, color=color, lw=1.4, label=labels[run])
        decoder = layers[(layers.run == run) & (layers["stack"] == "decoder")]
        if "param" in decoder:
            decoder = decoder[decoder.param.isna()]
        ln = decoder.groupby(["sublayer", "step"]).ln_input_norm.mean()
        for sublayer, style in (("self_attn", "-"), ("ffn", "--")):
            if sublayer in ln.index.get_level_values(0):
                ln_ax.plot(ln[sublayer].index, ln[sublayer].values, color=color, ls=style, lw=1.2,
                           label=f"{labels[run]}, {sublayer} LN")
        last = decoder[decoder.step == decoder.step.max()].assign(sq=lambda r: r.grad_norm ** 2)
        per_layer = np.sqrt(last.groupby("layer").sq.sum())
        grad_ax.plot(per_layer.index, per_layer.values, color=color, lw=1.4, marker=".", label=labels[run])
        for ax, points in ((update_ax, paper.DEEPNET_EARLY_UPDATE), (grad_ax, paper.DEEPNET_EARLY_DECODER_GRAD)):
            if group in points:
                ax.plot(list(points[group]), list(points[group].values()), ls="none", marker="o", mfc="none",
                        color=color, label=f"{group}, read off DeepNet Fig. 4")
    d_model = tables["runs"].d_model.dropna()
    if len(d_model):
        ln_ax.axhline(np.sqrt(d_model.iloc[0]), color="k", ls=":", lw=1, label=f"sqrt(d) = {np.sqrt(d_model.iloc[0]):.1f}")
    depth = int(metrics.depth.max())
    update_ax.set(xlabel="update", ylabel="model update ||F(x,θ_i) − F(x,θ_0)||",
                  title=f"{depth}L-{depth}L, model update")
    ln_ax.set(xlabel="update", ylabel="decoder mean ||LN input|| per token", title="LN inputs (decoder)")
    grad_ax.set(xlabel="decoder layer", ylabel="gradient norm",
                title=f"decoder gradient norm, update {int(layers.step.max())}")
    for ax in (update_ax, ln_ax, grad_ax):
        ax.legend(fontsize=5.5)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("deepnet_early_paper", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
