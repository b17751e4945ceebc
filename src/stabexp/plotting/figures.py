"""Figures drawn from the collected tables only (never from run folders directly)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

GROUP_ORDER = ["postln", "postln_warmup", "postln_init", "preln", "deepnorm", "admin"]
FIGSIZE_PER_PANEL = (4.5, 3.4)


def group_color(group: str):
    cmap = plt.get_cmap("tab10")
    idx = GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER) + hash(group) % 4
    return cmap(idx % 10)


def save(fig, path: Path) -> None:
    """PNG and PDF at a fixed size, without the metadata that changes between runs."""
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


def _run_order(runs: pd.DataFrame):
    first = runs.drop_duplicates("run")
    key = first.group.map(lambda g: GROUP_ORDER.index(g) if g in GROUP_ORDER else len(GROUP_ORDER))
    return list(first.assign(k=key).sort_values(["k", "run"]).run)


def model_update_over_steps(metrics: pd.DataFrame, path: Path, max_step: int = 200) -> bool:
    """DeepNet Fig. 3(a): ||F(x, theta_i) - F(x, theta_0)|| over early steps, a panel per depth,
    a line per run coloured by group."""
    if metrics.empty:
        return False
    data = metrics[metrics.step <= max_step].dropna(subset=["model_update"])
    depths = sorted(data.depth.unique())
    fig, axes = plt.subplots(1, len(depths), squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * len(depths), FIGSIZE_PER_PANEL[1]))
    for ax, depth in zip(axes[0], depths):
        at_depth = data[data.depth == depth]
        labels = run_labels(at_depth)
        for run in _run_order(at_depth):
            rows = at_depth[at_depth.run == run]
            ax.plot(rows.step, rows.model_update, color=group_color(rows.group.iloc[0]), lw=1.4,
                    label=labels[run])
        ax.set_title(f"{depth}L-{depth}L")
        ax.set_xlabel("step")
        ax.set_ylabel("model update ||F(x,θ_i) − F(x,θ_0)||")
        ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    return True


def grad_norm_by_layer(layers: pd.DataFrame, path: Path, step: int = 1) -> bool:
    """DeepNet Fig. 3(d) style: gradient norm of each layer's parameters at one early step
    (the layer's sublayers combined in quadrature), encoder and decoder, a row per depth."""
    if layers.empty:
        return False
    data = layers[layers.step == step].dropna(subset=["grad_norm"])
    if data.empty:
        return False
    data = data.assign(sq=data.grad_norm ** 2)
    per_layer = data.groupby(["run", "group", "depth", "stack", "layer"], as_index=False).sq.sum()
    per_layer["grad_norm"] = np.sqrt(per_layer.sq)
    depths = sorted(per_layer.depth.unique())
    fig, axes = plt.subplots(len(depths), 2, squeeze=False,
                             figsize=(FIGSIZE_PER_PANEL[0] * 2, FIGSIZE_PER_PANEL[1] * len(depths)))
    for row, depth in zip(axes, depths):
        at_depth = per_layer[per_layer.depth == depth]
        labels = run_labels(at_depth)
        for ax, stack in zip(row, ("encoder", "decoder")):
            for run in _run_order(at_depth):
                rows = at_depth[(at_depth.run == run) & (at_depth["stack"] == stack)].sort_values("layer")
                ax.plot(rows.layer, rows.grad_norm, marker="o", ms=3,
                        color=group_color(rows.group.iloc[0]), label=labels[run])
            ax.set_yscale("log")
            ax.set_title(f"{stack}, {depth}L-{depth}L, step {step}")
            ax.set_xlabel("layer (1 = bottom)")
            ax.set_ylabel("gradient norm")
            ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    return True
