"""Training on real text (preset multi30k_table, Multi30k De-En): per depth, the validation BLEU
and loss over the updates next to the model update ||F(x,θ_i) − F(x,θ_0)|| of the same runs (a
fixed batch of validation sentences), a line per group; a diverged run's lines stop where it
diverged."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, run_labels, run_order

EXPERIMENT = "multi30k_table"
PANELS = [("valid_bleu", "validation BLEU", "linear"), ("eval_loss", "validation loss", "linear"),
          ("model_update", "model update ||F(x,θ_i) − F(x,θ_0)||", "log")]


def draw(tables):
    metrics = tables["metrics"]
    if metrics.empty or "valid_bleu" not in metrics:
        return None
    depths = sorted(int(d) for d in metrics.depth.unique())
    labels = run_labels(metrics)
    fig, axes = plt.subplots(len(PANELS), len(depths), squeeze=False, sharex="col",
                             figsize=(FIGSIZE_PER_PANEL[0] * len(depths), FIGSIZE_PER_PANEL[1] * len(PANELS)))
    for j, depth in enumerate(depths):
        for i, (column, label, scale) in enumerate(PANELS):
            ax = axes[i, j]
            rows = metrics[(metrics.depth == depth) & metrics[column].notna()]
            if column == "model_update":
                rows = rows[rows.step >= 1]
            for run in run_order(rows):
                r = rows[rows.run == run]
                ax.plot(r.step, r[column], color=group_color(r.group.iloc[0]), lw=1.3,
                        marker="o" if column != "model_update" else None, ms=2.5, label=labels[run])
            ax.set_yscale(scale)
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"{depth}L-{depth}L")
        axes[-1, j].set_xlabel("update")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("translation", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
