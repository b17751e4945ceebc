"""ReZero against Post-LN and Admin on translation (Transformer-Clinic's iwslt14_de-en.md: ReZero
and ReZero-Post-LN 1-2 BLEU below the other 6L-6L models): test BLEU of every run, a dot per
seed, the bar the mean; beside it the validation BLEU over the updates. Preset: admin_rezero."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "admin_rezero"


def draw(tables):
    runs, metrics = tables["runs"], tables["metrics"]
    if runs.empty or "test_bleu" not in runs or runs.test_bleu.isna().all():
        return None
    groups = ordered_groups(runs.group)
    fig, (left, right) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1]))
    for k, group in enumerate(groups):
        bleu = runs[runs.group == group].test_bleu.dropna()
        left.bar(k, bleu.mean(), 0.6, color=group_color(group), alpha=0.5)
        left.scatter([k] * len(bleu), bleu, color=group_color(group), s=12, zorder=3)
        left.text(k, bleu.mean(), f"{bleu.mean():.2f}", ha="center", va="bottom", fontsize=7)
    left.set_xticks(range(len(groups)), groups, fontsize=7)
    left.set_ylabel("test BLEU")
    left.set_title(f"{int(runs.depth.iloc[0])}L-{int(runs.depth.iloc[0])}L, a dot per seed")
    if "valid_bleu" in metrics:
        for run, rows in metrics.dropna(subset=["valid_bleu"]).groupby("run"):
            right.plot(rows.step, rows.valid_bleu, color=group_color(rows.group.iloc[0]), lw=1, alpha=0.8)
    for group in groups:
        right.plot([], [], color=group_color(group), label=group)
    right.set_xlabel("update")
    right.set_ylabel("validation BLEU")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("admin_rezero", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
