"""Wortsman et al. 2023 (arXiv 2309.14322) Fig. 1 / 3 style: (left) final validation loss
against the learning rate, a line per setting (qk-layernorm, z-loss), a diverged run drawn at the
loss at init; (middle) the largest attention logit over all layers against the step, and (right)
the largest output log Z, both at the two highest learning rates of the grid. Preset: lr_sensitivity."""

import sys

import matplotlib.pyplot as plt

from stabexp.analysis import lr_sensitivity_table, run_setting
from stabexp.plotting.figures import FIGSIZE_PER_PANEL, figure_main

EXPERIMENT = "lr_sensitivity"


def draw(tables):
    runs, metrics, layers = tables["runs"], tables["metrics"], tables["layers"]
    if runs.lr.nunique() < 2 or "max_attn_logit" not in layers:
        return None
    table = lr_sensitivity_table(runs, metrics)
    settings = list(dict.fromkeys(table.setting))
    colors = {s: f"C{i}" for i, s in enumerate(settings)}
    fig, axes = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1] * 1.15))
    ax = axes[0]
    for setting, rows in table.groupby("setting", sort=False):
        shown = rows.final_eval_loss.fillna(rows.loss_0)
        ax.plot(rows.lr, shown, "o-", color=colors[setting], lw=1.4,
                label=f"{setting} (LR sens. {rows.lr_sensitivity.iloc[0]:.3f})")
        failed = rows[rows.final_eval_loss.isna()]
        ax.plot(failed.lr, failed.loss_0, "x", color=colors[setting], ms=9)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final validation loss (x: diverged, at loss_0)")
    ax.legend(fontsize=6)
    top_lrs = sorted(runs.lr.unique())[-2:]
    logits = (layers.dropna(subset=["max_attn_logit"]).groupby(["run", "step"], as_index=False)
              .max_attn_logit.max())
    for ax, frame, column, title in ((axes[1], logits, "max_attn_logit", "largest attention logit (all layers)"),
                                     (axes[2], metrics.dropna(subset=["log_z_max"]), "log_z_max", "largest output log Z")):
        for _, r in runs[runs.lr.isin(top_lrs)].sort_values("lr").iterrows():
            rows = frame[frame.run == r.run]
            style = "-" if r.lr == top_lrs[-1] else ":"
            ax.plot(rows.step, rows[column], style, color=colors[run_setting(r)], lw=1.3,
                    label=f"lr {r.lr:g}, {run_setting(r)}")
        ax.set_xlabel("step")
        ax.set_ylabel(column)
        ax.set_title(title, fontsize=9)
    axes[1].set_yscale("log")
    axes[2].legend(fontsize=5.5)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return figure_main("lr_sensitivity", EXPERIMENT, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
