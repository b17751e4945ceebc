"""Readings that several criteria share: trains or fails per cell, a paired comparison over seeds
(`beats`, and the best of several groups by it), grids of settings, LR sensitivity per seed. Each
criterion's own thresholds stay in its docstring and code.
"""

from __future__ import annotations

import itertools
from typing import Dict, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from stabexp.analysis import least_squares, lr_sensitivity
from stabexp.claims.registry import Evidence, every, mean, normal_setting, value_as_hydra_writes, whole_evidence


def outcome(ev: Evidence, recipe: str, group: str, depth=None, setting: Optional[str] = "") -> str:
    """"trains" when every seed's run trained (measures.with_outcome), "fails" when none did,
    "mixed" otherwise, "-" without runs or without the reference that tells."""
    runs = ev.runs(recipe=recipe, group=group, depth=depth, setting=setting)
    if runs.empty or runs.trained.isna().any():
        return "-"  # no runs, or no reference loss to judge one by
    if (runs.trained == 1).all():
        return "trains"
    return "fails" if (runs.trained == 0).all() else "mixed"


def paired_difference(a: pd.Series, b: pd.Series, higher_is_better: bool) -> pd.Series:
    """a - b seed by seed (b - a when lower is better: positive where a is better), over the seeds
    both have; two equal infinities (two diverged runs) a tie."""
    a, b = a.astype(float).align(b.astype(float), join="inner")
    d = (a - b) if higher_is_better else (b - a)
    return d.where(~(a.isin([np.inf, -np.inf]) & (a == b)), 0.0).dropna()


def beats(a: pd.Series, b: pd.Series, higher_is_better: bool) -> bool:
    """Paired by seed, `a` beats `b` when it is better in a majority of the seeds both have and its
    mean paired difference is larger than the noise of that difference (its standard error,
    sd / √n, over the seeds; with one seed, any lead). A seed where one of the two diverged (an
    infinite loss: measures.with_outcome) counts in the majority, and the mean and its noise are
    taken over the other seeds."""
    d = paired_difference(a, b, higher_is_better)
    if d.empty:
        return False
    finite = d[np.isfinite(d)]
    noise = finite.std(ddof=1) / np.sqrt(len(finite)) if len(finite) > 1 else 0.0
    ahead = finite.empty or finite.mean() > noise
    return bool((d > 0).sum() > len(d) / 2 and ahead)


def with_seeds(runs: pd.DataFrame, measure: str, min_seeds: int = 3, keep=()) -> pd.DataFrame:
    """The runs of the groups that hold `measure` in `min_seeds` seeds or more (and of `keep`):
    the groups a comparison counts, since one seed's lead is no test. With a seed left out to see
    whether one seed moves a verdict (registry.one_seed_moves), the groups are counted on the same
    cells before it was left out."""
    source = runs
    whole = whole_evidence()
    if whole is not None and not runs.empty:
        cells = runs[["recipe", "depth", "setting"]].drop_duplicates()
        source = whole.merge(cells, on=["recipe", "depth", "setting"])
    counted = source.dropna(subset=[measure]).groupby("group").seed.nunique()
    return runs[runs.group.isin(set(counted[counted >= min_seeds].index) | set(keep))]


def best_by_seed(ev: Evidence, recipe: str, depth, group: str, measure: str, higher_is_better: bool,
                 groups: Optional[Sequence[str]] = None, min_seeds: int = 3) -> Dict:
    """Is `group` the best at `depth` among every group the recipe ran there with `min_seeds` seeds
    or more (or among `groups`)? It is unless another group beats it (`beats`: paired by seed,
    better in a majority of seeds and on the mean by more than the noise of the difference); a tie
    with the best is the best. Groups with fewer seeds are left out: one seed's lead is no test.
    Returns {"best": bool, "rank": 1-based by mean, "of": groups compared, "beaten_by": [...]}."""
    runs = with_seeds(ev.runs(recipe=recipe, depth=depth, group=list(groups) if groups else None), measure,
                      min_seeds, keep=(group,))
    sign = 1.0 if higher_is_better else -1.0
    means = runs.groupby("group")[measure].mean().fillna(-np.inf if higher_is_better else np.inf)
    mine = ev.value(measure, recipe=recipe, group=group, depth=depth)
    beaten_by = [g for g in means.index if g != group
                 and beats(ev.value(measure, recipe=recipe, group=g, depth=depth), mine, higher_is_better)]
    rank = int((sign * means > sign * means[group]).sum()) + 1
    return {"best": not beaten_by, "rank": rank, "of": len(means), "beaten_by": beaten_by}


def grid(**axes: Iterable) -> list:
    """The settings of a sweep over `axes` ({key: values}), each as analysis.setting writes it
    from Hydra's record: its overrides sorted and joined by spaces, floats in Python's spelling."""
    keys = list(axes)
    return [normal_setting(" ".join(f"{k}={v}" for k, v in zip(keys, values)))
            for values in itertools.product(*(axes[k] for k in keys))]


def parse(setting: str) -> Dict[str, str]:
    return dict(part.split("=", 1) for part in str(setting).split() if "=" in part)


def with_setting(runs: pd.DataFrame, key: str, value: str) -> pd.DataFrame:
    """The runs whose setting has key=value (exactly as the sweep wrote it)."""
    value = value_as_hydra_writes(value)
    mask = runs.setting.map(lambda s: parse(s).get(key) == value).astype(bool)
    return runs.loc[mask]


def without(setting: str, key: str) -> str:
    return " ".join(p for p in str(setting).split() if not p.startswith(f"{key}="))


def lr_sensitivities(runs: pd.DataFrame) -> pd.DataFrame:
    """Per seed and setting without its lr (`rest`): Wortsman et al.'s LR sensitivity over the
    lrs run (analysis.lr_sensitivity; a diverged run counts as the loss at init)."""
    runs = runs.assign(rest=runs.setting.map(lambda s: without(s, "train.lr")),
                       final=np.where(runs.status == "completed", runs.final_eval_loss, np.nan))
    out = []
    for (seed, group, rest), r in runs.groupby(["seed", "group", "rest"]):
        out.append({"seed": seed, "group": group, "rest": rest, "lrs": len(r),
                    "sensitivity": lr_sensitivity(r.final, r["eval_loss@0"].mean())})
    return pd.DataFrame(out)


def log_slope_per_seed(runs: pd.DataFrame, x: str, y: str, log_x: bool = True, log_y: bool = False) -> pd.DataFrame:
    """Per seed: least squares of y (or ln y) on ln x (or x), with R^2."""
    out = []
    for seed, r in runs.dropna(subset=[x, y]).groupby("seed"):
        if r[x].nunique() < 3:
            continue
        xs = np.log(r[x].astype(float)) if log_x else r[x].astype(float)
        ys = np.log(r[y].astype(float)) if log_y else r[y].astype(float)
        out.append({"seed": seed, **least_squares(xs, ys)})
    return pd.DataFrame(out, columns=["seed", "slope", "intercept", "r2"])


def growth(ev: Evidence, recipe: str, group: str, measure: str, depths: Sequence[int], setting="") -> pd.Series:
    """Per seed: the measure at the deepest of `depths` over that at the shallowest."""
    deep = ev.value(measure, recipe=recipe, group=group, depth=max(depths), setting=setting)
    shallow = ev.value(measure, recipe=recipe, group=group, depth=min(depths), setting=setting)
    deep, shallow = deep.align(shallow, join="outer")
    return deep / shallow  # NaN where a seed lacks one end: it fails every()


__all__ = ["outcome", "paired_difference", "beats", "with_seeds", "best_by_seed", "grid", "parse", "with_setting", "without", "lr_sensitivities", "log_slope_per_seed",
           "growth", "every", "mean"]
