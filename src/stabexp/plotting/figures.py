"""What every figure script (scripts/fig_*.py) shares: reading the collected tables, picking a
preset's runs, colours and labels, and saving PNG + PDF byte-reproducibly. Figures are drawn
from the collected tables only, never from run folders directly."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path
from typing import Callable, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from stabexp.analysis import lr_sensitivity_table, run_setting, update_bound_steps  # noqa: E402
from stabexp.plotting.collect import RUN_FILES, Tables  # noqa: E402

# The first six keep the colours of the figures made before the other Table 1 rows arrived.
GROUP_ORDER = ["postln", "postln_warmup", "postln_init", "preln", "deepnorm", "admin",
               "ds_init", "admin_closed_form", "rezero", "rezero_postln", "fixup", "t_fixup",
               "dlcl", "normformer", "sandwich", "subln", "deepnorm_torchscale",
               "hybrid_postln_preln", "hybrid_preln_postln",
               "peri_ln", "reordered_norm", "layernorm_scaled", "mix_ln", "hybridnorm", "hybridnorm_star", "dyt"]
FIGSIZE_PER_PANEL = (4.5, 3.4)


def group_color(group: str):
    # crc32, not hash(): str hashes change from one process to the next.
    idx = GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER) + zlib.crc32(group.encode()) % 3
    # tab10 for the first ten, tab20's light shades for the next seven, Dark2 for the hybrids
    # (drawn beside the placements they mix), Set1 without its red (Pre-LN's, which the
    # placements of 2024-2025 are drawn beside) and its yellow: distinct colours.
    if idx < 10:
        return plt.get_cmap("tab10")(idx)
    if idx < 17:
        return plt.get_cmap("tab20")((2 * (idx - 10) + 1) % 20)
    if idx < 19:
        return plt.get_cmap("Dark2")(idx - 17)
    return plt.get_cmap("Set1")((1, 2, 3, 4, 6, 7, 8)[(idx - 19) % 7])


def save(fig, path: Path) -> None:
    """PNG and PDF at a fixed size, without the metadata that changes between runs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path.with_suffix(".png"), dpi=120, metadata={"Software": None})
    fig.savefig(path.with_suffix(".pdf"), metadata={"Creator": None, "Producer": None, "CreationDate": None})
    plt.close(fig)


def run_labels(runs: pd.DataFrame) -> dict:
    """run -> legend label: the group, plus the overrides that tell its runs apart (run folder
    names are `key=value__key=value`, see config.run_name)."""
    labels = {}
    for group, rows in runs.groupby("group"):
        names = sorted(rows.run.unique())
        parts = {r: set(Path(r).name.split("__")) for r in names}
        common = set.intersection(*parts.values())
        for r in names:
            extra = sorted(p for p in parts[r] - common if not p.startswith(("group=", "depth=")))
            labels[r] = group + (f" ({', '.join(extra)})" if extra else "")
    # The same overrides in two sweep folders (a repeated sweep): number them apart.
    seen: dict = {}
    for r in sorted(labels):
        seen[labels[r]] = seen.get(labels[r], 0) + 1
        if seen[labels[r]] > 1:
            labels[r] += f" [{seen[labels[r]]}]"
    return labels


def update_vs_depth(metrics: pd.DataFrame, extra: Optional[Callable] = None, last: Optional[int] = None):
    """DeepNet's model update against depth (v1 Fig. 5): a panel per update (1, 10 and `last`,
    the last probed step by default), a line per group, the mean over seeds at each depth;
    `extra(ax)` draws more on each panel (a paper's values). None when there are fewer than two
    depths."""
    from matplotlib.ticker import NullFormatter

    data = metrics.dropna(subset=["model_update"])
    if data.empty or data.depth.nunique() < 2:
        return None
    steps = sorted({1, 10, int(data.step.max()) if last is None else last} & set(data.step.unique()))
    depths = sorted(data.depth.unique())
    fig, axes = plt.subplots(1, len(steps), squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * len(steps), FIGSIZE_PER_PANEL[1]))
    for ax, step in zip(axes[0], steps):
        at_step = data[data.step == step]
        for group in ordered_groups(at_step.group):
            rows = at_step[at_step.group == group].groupby("depth").model_update.mean()
            ax.plot(rows.index, rows.values, marker="o", ms=4, color=group_color(group), label=group)
        if extra is not None:
            extra(ax)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("depth N (N L-N L)")
        ax.set_ylabel("model update ||F(x,θ_i) − F(x,θ_0)||")
        ax.set_title(f"step {step}")
    axes[0][-1].legend(fontsize=7, ncol=2 if data.group.nunique() > 8 else 1)
    fig.tight_layout()
    return fig


# --- reading the collected tables ------------------------------------------------------------

TABLES = ("runs", *RUN_FILES)


def read_collected(collected: Path) -> Tables:
    """The tables `make plots` wrote (runs, metrics, layers; empty frames where one is empty)."""
    out = Tables()
    for name in TABLES:
        path = Path(collected) / f"{name}.csv"
        out[name] = (pd.read_csv(path, low_memory=False) if path.exists() and path.stat().st_size > 1
                     else pd.DataFrame())
    return out


def preset_task(experiment: str) -> str:
    """The task `stabexp run experiment=NAME` trains on when no override names one."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from stabexp.paths import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}"])
    GlobalHydra.instance().clear()
    return cfg.task.name


def preset_tables(tables: dict, experiment: str) -> Tables:
    """The rows of one preset's runs: those at the default scale when there are any, else the
    quick ones, so a quick pass never mixes into the default-scale figures; and of one task:
    the preset's own where runs on other tasks (`experiment=NAME task=reverse`) lie beside it."""
    runs = tables["runs"]
    if runs.empty or "experiment" not in runs:
        return Tables({name: frame.iloc[0:0] for name, frame in tables.items()})
    runs = runs[runs.experiment == experiment]
    if (runs.scale == "default").any():
        runs = runs[runs.scale == "default"]
    if "task" in runs and runs.task.nunique() > 1:
        own = runs[runs.task == preset_task(experiment)]
        runs = own if not own.empty else runs[runs.task == sorted(runs.task.dropna())[0]]
    keep = set(runs.run)
    return Tables({name: (frame[frame.run.isin(keep)] if not frame.empty else frame)
                   for name, frame in tables.items()})


def skip_message(figure: str, experiment: str) -> str:
    return (f"skipped {figure}: no runs of the {experiment} preset under outputs/ "
            f"(make them with `stabexp run experiment={experiment}`)")


def scale_note(runs: pd.DataFrame) -> str:
    return " (scale=quick)" if not runs.empty and (runs.scale == "quick").all() else ""


def ordered_groups(groups) -> list:
    return sorted(set(groups), key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER else 99, g))


def run_order(runs: pd.DataFrame):
    first = runs.drop_duplicates("run")
    rank = {g: i for i, g in enumerate(ordered_groups(first.group))}
    return list(first.assign(k=first.group.map(rank)).sort_values(["k", "run"]).run)


# Set by `make plots` (scripts/make_plots.py) to a list: each figure script then appends
# (figure, preset, drawn) to it instead of printing a line per skipped figure, and make_plots
# sums them up in one line. None: a script run on its own prints its own line.
outcomes: Optional[list] = None


def figure_main(name: str, experiment: str, draw: Callable[[dict], Optional[object]],
                argv=None) -> int:
    """Body of a figure script: read outputs/collected (or the folder given as the one
    argument), keep the preset's runs, draw, save outputs/figures/NAME.{png,pdf}."""
    from stabexp.paths import outputs_dir

    argv = sys.argv[1:] if argv is None else argv
    outputs = Path(argv[0]) if argv else outputs_dir()
    tables = preset_tables(read_collected(outputs / "collected"), experiment)
    fig = draw(tables) if not tables["runs"].empty else None
    return _saved(fig, name, experiment, outputs,
                  f"{len(tables['runs'])} runs of {experiment}{scale_note(tables['runs'])}")


def _saved(fig, name: str, experiment: str, outputs: Path, source: str) -> int:
    """Save a drawn figure as outputs/figures/NAME.{png,pdf}, or report it skipped (fig None)."""
    if outcomes is not None:
        outcomes.append((name, experiment, fig is not None))
    if fig is None:
        if outcomes is None:
            print(skip_message(name, experiment))
        return 0
    save(fig, outputs / "figures" / name)
    print(f"wrote {outputs / 'figures' / name}.png and .pdf ({source})")
    return 0


def cells_main(name: str, experiment: str, recipe: str, draw: Callable[[pd.DataFrame, pd.DataFrame], Optional[object]],
               argv=None) -> int:
    """Body of a figure script drawn from cells (stabexp/cells.py): by default the preset's runs
    under outputs/collected, as every figure; with `--cells TABLE` the committed table of
    finished runs of `recipe` (docs/data) and its curves, which outlive the run folders.
    draw(cells, curves) gets the cells and their validation curves."""
    from stabexp import cells as cell_tables
    from stabexp.paths import outputs_dir

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--cells"]:
        table = Path(argv[1])
        cells = cell_tables.read(table)
        cells = cells[cells.recipe == recipe]
        curves_file = cell_tables.curves_path(table)
        curves = cell_tables.read(curves_file) if curves_file.is_file() else pd.DataFrame(columns=cell_tables.CURVE_COLUMNS)
        curves = curves[curves.recipe == recipe]
        outputs, source = outputs_dir(), f"{len(cells)} cells of {recipe} in {table}"
    else:
        outputs = Path(argv[0]) if argv else outputs_dir()
        tables = preset_tables(read_collected(outputs / "collected"), experiment)
        cells, curves = cell_tables.from_tables(tables, recipe)
        source = f"{len(cells)} runs of {experiment}{scale_note(tables['runs'])}"
        # What every run of the sweep was given (`train.steps=12` on the command line) is not a
        # setting of one cell: the figure compares the settings that differ.
        shared = set.intersection(*(set(v.split()) for v in cells.setting)) if not cells.empty else set()
        for frame in (cells, curves):
            frame["setting"] = frame.setting.map(lambda v: " ".join(p for p in v.split() if p not in shared))
    return _saved(draw(cells, curves) if not cells.empty else None, name, experiment, outputs, source)


def training_curves(tables: dict, title: str):
    """Training loss (left), eval loss (middle) and model update (right) over the steps, a line
    per run: what a sweep of very deep models shows of its training."""
    metrics = tables["metrics"]
    if metrics.empty:
        return None
    fig, panels = plt.subplots(1, 3, figsize=(FIGSIZE_PER_PANEL[0] * 3, FIGSIZE_PER_PANEL[1]))
    labels = run_labels(tables["runs"]) if not tables["runs"].empty else {}
    for run in run_order(metrics):
        rows = metrics[metrics.run == run]
        color, label = group_color(rows.group.iloc[0]), labels.get(run, rows.group.iloc[0])
        for ax, column in zip(panels, ("loss", "eval_loss", "model_update")):
            points = rows.dropna(subset=[column])
            ax.plot(points.step, points[column], color=color, lw=1.2, label=label, marker="o" if column == "eval_loss" else None,
                    ms=3)
    for ax, name in zip(panels, ("training loss", "eval loss", "model update")):
        ax.set_xlabel("step")
        ax.set_ylabel(name)
    panels[2].set_yscale("symlog", linthresh=1e-3)
    panels[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def lr_sensitivity_figure(tables):
    """Wortsman et al. 2023 (arXiv 2309.14322) Fig. 1 / 3 style, for any lr sweep: (left) final
    validation loss against the learning rate, a line per setting, a diverged run drawn at the
    loss at init; (middle) the largest attention logit over all layers against the step, and
    (right) the largest output log Z, both at the two highest learning rates of the grid."""
    runs, metrics, layers = tables["runs"], tables["metrics"], tables["layers"]
    if runs.lr.nunique() < 2 or "max_attn_logit" not in layers:
        return None
    table = lr_sensitivity_table(runs, metrics)
    settings = list(dict.fromkeys(table.setting))
    # One colour per setting; the seeds of a setting share it.
    unseeded = {s: " ".join(p for p in s.split() if not p.startswith("seed=")) for s in settings}
    shades = {u: f"C{i}" for i, u in enumerate(dict.fromkeys(unseeded.values()))}
    colors = {s: shades[unseeded[s]] for s in settings}
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


def update_bound_figure(tables):
    """DeepNet Theorem 4.1 / 4.3 measured (probe.update_bound): left, the bound (solid) and the
    model update relative to ||F(x, theta_0)|| (dashed) over the steps of the deepest runs; right,
    both at the first probe step against depth (where every depth's sublayers moved alike), a
    line per group."""
    steps = update_bound_steps(tables["metrics"], tables["update_bound"], tables["runs"])
    if steps.empty:
        return None
    fig, (over, depth) = plt.subplots(1, 2, figsize=(FIGSIZE_PER_PANEL[0] * 2.2, FIGSIZE_PER_PANEL[1]))
    deepest = steps[steps.depth == steps.depth.max()]
    first = steps[steps.step == steps.step.min()]
    for group in ordered_groups(steps.group):
        color = group_color(group)
        rows = deepest[deepest.group == group].groupby("step")[["bound", "measured"]].mean()
        over.plot(rows.index, rows.bound, "-", color=color, label=f"{group} bound")
        over.plot(rows.index, rows.measured, "--", color=color, label=f"{group} measured")
        at_first = first[first.group == group].groupby("depth")[["bound", "measured"]].mean()
        depth.plot(at_first.index, at_first.bound, "o-", color=color, label=f"{group} bound", ms=4)
        depth.plot(at_first.index, at_first.measured, "s--", color=color, mfc="none", label=f"{group} measured", ms=4)
    over.set_title(f"{int(steps.depth.max())} layers", fontsize=9)
    over.set_xlabel("step")
    depth.set_xlabel("layers")
    depth.set_title(f"at step {int(first.step.min())}", fontsize=9)
    over.set_xscale("log")
    for ax in (over, depth):
        ax.set_yscale("log")
        ax.set_ylabel("model update / ||F(x, theta_0)||")
        ax.legend(fontsize=6)
    depth.set_xscale("log")
    depths = sorted(steps.depth.unique())
    depth.set_xticks(depths, [str(int(d)) for d in depths])
    depth.minorticks_off()
    fig.tight_layout()
    return fig
