"""Admin Theorem 2 / Fig. 4 (Liu et al. 2020) as Transformer-Clinic measures it: along ONE deep
encoder at init, the change of each sublayer's std-normalised input under delta = 1e-4 sign(N(0,1)),
against the sublayer index i; a panel per width, a line per group (mean over seeds, the band
their min-max). Curves are divided by Post-LN's at the last sublayer, ours by ours and the paper's
by the paper's, so the shapes and the Post-LN / Pre-LN gap compare although the batches differ;
the markers are read off the paper's figure. Preset: admin_clinic."""

import sys

import matplotlib.pyplot as plt

from stabexp import paper
from stabexp.analysis import clinic_fits, encoder_input_change
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main, group_color, ordered_groups

EXPERIMENT = "admin_clinic"


def draw(tables):
    curves = encoder_input_change(tables["layers"])
    if curves.empty:
        return None
    fits = clinic_fits(curves)
    d_model = tables["runs"].drop_duplicates("model").set_index("model").d_model
    widths = sorted(curves.model.unique(), key=lambda m: d_model.get(m, 0))
    fig, axes = plt.subplots(1, len(widths), squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * 1.2 * len(widths), FIGSIZE_PER_PANEL[1] * 1.2))
    for ax, model in zip(axes[0], widths):
        rows = curves[(curves.model == model)]
        rows = rows[rows.depth == rows.depth.max()]
        by_index = rows.groupby(["group", "index"]).input_change
        mean, low, high = by_index.mean(), by_index.min(), by_index.max()
        scale = mean["postln"].iloc[-1] if "postln" in mean.index.get_level_values(0) else mean.max()
        paper_scale = paper.ADMIN_INPUT_CHANGE["postln"][200]
        for group in ordered_groups(rows.group):
            color = group_color(group)
            fit = fits[(fits.model == model) & (fits.group == group)]
            r2 = (f", R² lin {fit.linear_r2.iloc[0]:.3f} / log {fit.log_r2.iloc[0]:.3f}" if not fit.empty else "")
            ax.plot(mean[group].index, mean[group].values / scale, color=color, lw=1.4, label=group + r2)
            ax.fill_between(mean[group].index, low[group].values / scale, high[group].values / scale,
                            color=color, alpha=0.2, lw=0)
            if group in paper.ADMIN_INPUT_CHANGE:
                points = paper.ADMIN_INPUT_CHANGE[group]
                ax.plot(list(points), [v / paper_scale for v in points.values()], ls="none", marker="o",
                        mfc="none", color=color, label=f"{group}, read off Admin Fig. 4")
        n_runs = rows.groupby("group").run.nunique().min()
        ax.set_title(f"{model} (d = {d_model.get(model, '?')}), {int(rows.depth.max())}-layer encoder, "
                     f"{n_runs} seeds", fontsize=9)
        ax.set_xlabel("sublayer i (its input), bottom up")
        ax.set_ylabel("input change / Post-LN's at the last i")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("admin_clinic", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
