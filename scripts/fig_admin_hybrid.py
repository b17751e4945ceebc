"""Admin's hybrid table (Liu et al. 2020, arXiv 2004.08249, Sec. 3): Post-LN with warm-up, Pre-LN
and the two hybrids (a Post-LN encoder under a Pre-LN decoder, and the reverse). Left: the final
eval loss of every run (a dot per seed, the bar the mean) at each depth, against the chance loss;
right: the eval loss over the steps at the largest depth, a line per run. Preset: admin_hybrid."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "admin_hybrid"


def draw(tables):
    runs, metrics = tables["runs"], tables["metrics"]
    if runs.empty or metrics.empty:
        return None
    groups, depths = ordered_groups(runs.group), sorted(runs.depth.unique())
    fig, (left, right) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.4, FIGSIZE_PER_PANEL[1] * 1.1))
    width = 0.8 / len(groups)
    for k, group in enumerate(groups):
        for d, depth in enumerate(depths):
            cell = runs[(runs.group == group) & (runs.depth == depth)]
            x = d + (k - (len(groups) - 1) / 2) * width
            losses = cell.final_eval_loss.dropna()
            if len(losses):
                left.bar(x, losses.mean(), width * 0.9, color=group_color(group), alpha=0.5,
                         label=group if d == 0 else None)
                left.scatter([x] * len(losses), losses, color=group_color(group), s=10, zorder=3)
            for _ in cell[cell.status == "diverged"].itertuples():
                left.text(x, 0.02, "div", ha="center", fontsize=6, color="red")
    chance = runs.chance_loss.dropna()
    if len(chance):
        left.axhline(chance.iloc[0], color="grey", ls=":", lw=1, label="chance")
    left.set_xticks(range(len(depths)), [f"{d}L-{d}L" for d in depths])
    left.set_ylabel("final eval loss")
    left.set_title("final eval loss, a dot per seed")
    left.legend(fontsize=7)
    deepest = max(depths)
    evals = metrics[(metrics.depth == deepest)].dropna(subset=["eval_loss"])
    for run, rows in evals.groupby("run"):
        group = rows.group.iloc[0]
        right.plot(rows.step, rows.eval_loss, color=group_color(group), lw=1, alpha=0.8)
    for group in groups:
        right.plot([], [], color=group_color(group), label=group)
    right.set_yscale("log")
    right.set_xlabel("step")
    right.set_ylabel("eval loss")
    right.set_title(f"{deepest}L-{deepest}L, a line per run")
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("admin_hybrid", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
