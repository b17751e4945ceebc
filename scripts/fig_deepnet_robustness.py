"""DeepNet Fig. 7 (Wang et al. 2022): validation loss over the updates of 18L-18L models under
one change at a time, a panel per axis (lr, batch, width); DeepNorm solid, Post-LN-init dashed.
Preset: deepnet_robustness; `--cells docs/data/deepnet_cells.csv` draws the committed curves of
the multi30k_table recipe."""

import sys

import matplotlib.pyplot as plt

from stabexp.plotting.figures import FIGSIZE_PER_PANEL, cells_main

EXPERIMENT, RECIPE = "deepnet_robustness", "multi30k_table"
# The unchanged recipe in grey on every panel, a smaller value in green, larger ones in orange.
BASE, SMALLER, LARGER, LARGEST = "#333333", "#1b9e77", "#d95f02", "#7570b3"
AXES = {"learning rate": {"robustness=lr_x0.5": ("lr x 0.5", SMALLER), "": ("lr 1e-3", BASE),
                          "robustness=lr_x1.5": ("lr x 1.5", LARGER)},
        "batch": {"": ("2048 tokens", BASE), "robustness=batch_x2": ("x 2", LARGER),
                  "robustness=batch_x4": ("x 4", LARGEST)},
        "width": {"": ("64", BASE), "robustness=width_96": ("96", LARGER), "robustness=width_128": ("128", LARGEST)}}
STYLE = {"deepnorm": "-", "postln_init": "--"}


def draw(cells, curves):
    # The unchanged cell is the preset's robustness=base, or where a group has none the recipe's
    # own 18L-18L run (the same settings, run by another preset).
    curves = curves[curves.group.isin(STYLE) & (curves.depth == curves.depth.max())]
    has_base = set(curves[curves.setting == "robustness=base"].group)
    curves = curves[~((curves.setting == "") & curves.group.isin(has_base))]
    curves = curves.assign(setting=curves.setting.replace("robustness=base", ""))
    if curves.empty or curves.setting.nunique() < 2:
        return None
    fig, panels = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1]), sharey=True)
    for ax, (title, variants) in zip(panels, AXES.items()):
        for setting, (label, color) in variants.items():
            for group, style in STYLE.items():
                rows = curves[(curves.setting == setting) & (curves.group == group) & (curves.step > 0)]
                if not rows.empty:
                    ax.plot(rows.step, rows.eval_loss, style, color=color, lw=1.2, label=f"{group}, {label}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("update")
        ax.legend(fontsize=6)
    panels[0].set_ylabel("validation loss")
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    return cells_main("deepnet_robustness", EXPERIMENT, RECIPE, draw, argv)


if __name__ == "__main__":
    sys.exit(main())
