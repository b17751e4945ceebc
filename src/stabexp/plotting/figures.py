"""What every figure shares (plotting/table.py lists them): reading the collected tables, picking
a preset's runs, colours and labels, and saving PNG + PDF byte-reproducibly. Figures are drawn
from the collected tables only, never from run folders directly."""

from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

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


def scale_note(runs: pd.DataFrame) -> str:
    return " (scale=quick)" if not runs.empty and (runs.scale == "quick").all() else ""


def ordered_groups(groups) -> list:
    return sorted(set(groups), key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER else 99, g))


def run_order(runs: pd.DataFrame):
    first = runs.drop_duplicates("run")
    rank = {g: i for i, g in enumerate(ordered_groups(first.group))}
    return list(first.assign(k=first.group.map(rank)).sort_values(["k", "run"]).run)
