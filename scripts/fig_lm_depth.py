"""Decoder-only language models at 6, 18 and 100 layers (DeepNet's decoder-only constants for
DeepNorm): validation loss against the step, a panel per depth, a line per group; a diverged
run ends where it diverged. Reference lines: the chance loss and the unigram model's loss (the
training stream's token frequencies). Preset: lm_depth."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "lm_depth"


def draw(tables):
    runs, metrics = tables["runs"], tables["metrics"].dropna(subset=["eval_loss"])
    if metrics.empty:
        return None
    depths = sorted(runs.depth.unique())
    fig, axes = plt.subplots(1, len(depths), figsize=(FIGSIZE_PER_PANEL[0] * len(depths), FIGSIZE_PER_PANEL[1]),
                             squeeze=False)
    for ax, depth in zip(axes[0], depths):
        for group in ordered_groups(runs[runs.depth == depth].group):
            for _, r in runs[(runs.depth == depth) & (runs.group == group)].iterrows():
                rows = metrics[metrics.run == r.run]
                ax.plot(rows.step, rows.eval_loss, "o-", ms=3, color=group_color(group), lw=1.4,
                        label=group + (f" (diverged @ {int(r.diverged_at_step)})" if r.status == "diverged" else ""))
        chance = runs.chance_loss.dropna()
        if len(chance):
            ax.axhline(chance.iloc[0], color="grey", ls=":", lw=1, label="chance (uniform)")
        unigram = runs.unigram_eval_loss.dropna() if "unigram_eval_loss" in runs else []
        if len(unigram):
            ax.axhline(unigram.iloc[0], color="grey", ls="--", lw=1, label="unigram (token frequencies)")
        ax.set_title(f"decoder-only, {depth} layers")
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats / token)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("lm_depth", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
