"""Fits and summaries that the figures and `stabexp report` share: one place for each.

- Admin's Theorem 2 (Liu et al. 2020, Sec. 3): output change against the number of sublayers N,
  fitted both as a + b N (Post-LN's expected shape) and as a + b ln N (Pre-LN's and Admin's);
  each fit's R^2 says which shape the data follow.
- The same theorem as Transformer-Clinic measures it: the change of each sublayer's input along
  ONE deep encoder, fitted linear and log in the sublayer index i (clinic_fits).
- Gradient at init against depth (Xiong et al. 2020, Sec. 3): the slope of log ||grad W_2|| on
  log L, 0 for a depth-independent gradient and -1/2 for one shrinking like 1/sqrt(L).
- Admin's Theorem 1 (Liu et al. 2020, Sec. 3): the gradient of each sublayer's output at init
  relative to the largest in the network; where a stack's gradients vanish (output_gradients).
Every fitted number comes with its spread over seeds: one draw is not a result.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import pandas as pd


def least_squares(x, y) -> Dict[str, float]:
    """y ~ intercept + slope * x, with the coefficient of determination R^2."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - (residual ** 2).sum() / total if total > 0 else float("nan")
    return {"slope": float(slope), "intercept": float(intercept), "r2": float(r2)}


def linear_and_log_fits(n, change) -> Dict[str, Dict[str, float]]:
    """{'linear': fit of change on N, 'log': fit of change on ln N}."""
    n = np.asarray(n, dtype=float)
    return {"linear": least_squares(n, change), "log": least_squares(np.log(n), change)}


def loglog_slope(x, y) -> Dict[str, float]:
    """Slope of log y on log x (the exponent of a power law), with R^2 of that line."""
    return least_squares(np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float)))


def sublayer_count(layers: pd.DataFrame) -> pd.Series:
    """Residual sublayers per run (encoder: 2 per layer, decoder: 3), from its step-0 layers rows
    of sublayers (not the weight rows of probe.weights, which have `param` set)."""
    at_init = layers[layers.step == 0]
    if "param" in at_init:
        at_init = at_init[at_init.param.isna()]
    return at_init.groupby("run").size()


def output_change_table(metrics: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """One row per run with an output-change measurement: run, group, depth, seed, sublayers,
    output_change."""
    rows = metrics[(metrics.step == 0)].dropna(subset=["output_change"])
    if rows.empty:
        return pd.DataFrame(columns=["run", "group", "depth", "seed", "sublayers", "output_change"])
    counts = sublayer_count(layers).rename("sublayers")
    table = rows[["run", "group", "depth", "seed", "output_change"]].merge(counts, left_on="run",
                                                                         right_index=True)
    return table.sort_values(["group", "sublayers", "seed"]).reset_index(drop=True)


def output_change_fits(table: pd.DataFrame) -> pd.DataFrame:
    """Per group, over every (run, seed) point: both fits, plus the mean output change at the
    fewest and the most sublayers."""
    out = []
    for group, rows in table.groupby("group"):
        if rows.sublayers.nunique() < 3:
            continue  # two depths fit any two-parameter curve exactly
        fits = linear_and_log_fits(rows.sublayers, rows.output_change)
        means = rows.groupby("sublayers").output_change.mean()
        per_seed = [linear_and_log_fits(r.sublayers, r.output_change) for _, r in rows.groupby("seed")
                    if r.sublayers.nunique() >= 3]
        linear = spread(f["linear"]["r2"] for f in per_seed) if per_seed else None
        log = spread(f["log"]["r2"] for f in per_seed) if per_seed else None
        out.append({"group": group, "points": len(rows),
                    "sublayers": f"{means.index.min()}-{means.index.max()}",
                    "change_at_min": means.iloc[0], "change_at_max": means.iloc[-1],
                    "linear_slope": fits["linear"]["slope"], "linear_intercept": fits["linear"]["intercept"],
                    "linear_r2": fits["linear"]["r2"], "log_slope": fits["log"]["slope"],
                    "log_intercept": fits["log"]["intercept"], "log_r2": fits["log"]["r2"],
                    "seed_linear_r2": f"{linear['min']:.3f}-{linear['max']:.3f}" if linear else "-",
                    "seed_log_r2": f"{log['min']:.3f}-{log['max']:.3f}" if log else "-"})
    return pd.DataFrame(out)


def last_w2_grad(layers: pd.DataFrame) -> pd.DataFrame:
    """Per run: the at-init gradient norm of W_2 in the last decoder FFN (Xiong et al.'s
    W^{2,L}), with group, depth and seed."""
    rows = layers[(layers.step == 0) & (layers["stack"] == "decoder") & (layers.sublayer == "ffn")]
    rows = rows.dropna(subset=["w2_grad_norm"])
    if rows.empty:
        return pd.DataFrame(columns=["run", "group", "depth", "seed", "w2_grad_norm"])
    last = rows.loc[rows.groupby("run").layer.idxmax()]
    return last[["run", "group", "depth", "seed", "w2_grad_norm"]].reset_index(drop=True)


def w2_grad_slopes(table: pd.DataFrame) -> pd.DataFrame:
    """Per group: log-log slope of the last W_2 gradient on depth (0: flat, -0.5: 1/sqrt(L)),
    fitted over every point (slope, r2), and fitted per seed: the spread of those slopes is
    what a new seed can move the number by. With the same depths for every seed the slope over
    every point is the mean of the per-seed slopes, so seed_slope_sd / sqrt(seeds) is its
    standard error."""
    out = []
    for group, rows in table.groupby("group"):
        if rows.depth.nunique() < 2:
            continue
        fit = loglog_slope(rows.depth, rows.w2_grad_norm)
        per_seed = [loglog_slope(r.depth, r.w2_grad_norm) for _, r in rows.groupby("seed") if r.depth.nunique() >= 2]
        slopes = spread(f["slope"] for f in per_seed)
        out.append({"group": group, "points": len(rows), "slope": fit["slope"], "r2": fit["r2"],
                    "seeds": slopes["n"], "seed_slope_sd": slopes["sd"], "seed_slope_min": slopes["min"],
                    "seed_slope_max": slopes["max"]})
    return pd.DataFrame(out)


# --- spherical motion dynamics (theory: stabexp/theory.py) -----------------------------------

def smd_window_start(time_constant: float, steps: int, n_tau: float = 5.0) -> float:
    """Equilibrium is averaged from n_tau time constants on, and never over the first half of
    the run (the init sits far from equilibrium, which the linear rate does not count)."""
    return max(n_tau * time_constant, steps / 2)


def time_to_equilibrium(steps, values, equilibrium: float, tolerance: float = 0.1, smooth: int = 10) -> float:
    """First step at which the running mean (over `smooth` rows) of `values` comes within
    `tolerance` of `equilibrium`; NaN if it never does. A single step's angle scatters by about
    10% around the equilibrium, so "stays within 10%" would measure the noise, not the approach;
    the running mean lags by about `smooth` rows, which bounds the resolution."""
    series = pd.Series(np.asarray(values, dtype=float), index=np.asarray(steps)).rolling(smooth).mean()
    inside = (series - equilibrium).abs() <= tolerance * equilibrium
    return float(inside[inside].index[0]) if inside.any() else float("nan")


def is_scale_invariant(layers: pd.DataFrame) -> pd.Series:
    """The weight rows flagged scale-invariant: True/False as one sweep's layers.csv reads back,
    1.0/0.0 once collected beside runs without the column."""
    return layers.scale_invariant.map(lambda v: str(v) in ("True", "1.0", "1")).astype(bool)


def smd_equilibrium(runs: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """One row per run with a predicted equilibrium: the measured equilibrium angular update of
    its scale-invariant weights (mean over weights and over the window) against the theory, the
    same mean for its other weights, the time to equilibrium against the time constant, and the
    measured norm against the predicted one (SGD/SGDM from the measured L = E(||g|| ||w||)^2,
    AdamW from the element count)."""
    from stabexp import theory

    out = []
    weights = layers.dropna(subset=["angular_update"]) if "angular_update" in layers else layers.iloc[0:0]
    for _, run in runs.dropna(subset=["theory_angular_update"]).iterrows():
        rows = weights[weights.run == run.run]
        if rows.empty:
            continue
        flag = is_scale_invariant(rows)
        invariant, other = rows[flag], rows[~flag]
        start = smd_window_start(run.theory_time_constant, run.steps_done)
        in_window = invariant[invariant.step >= start]
        measured = in_window.angular_update.mean()
        per_step = invariant.groupby("step").angular_update.mean()
        settle = time_to_equilibrium(per_step.index, per_step.values, measured)
        # Predicted equilibrium norm of each scale-invariant weight, then the mean ratio.
        ratios = []
        for _, w in in_window.groupby(["stack", "layer", "sublayer", "param"]):
            if run.optim in ("sgd", "sgdm"):
                grad_sq = ((w.grad_norm * w.weight_norm) ** 2).mean()
                predicted = theory.equilibrium_norm(run.optim, run.lr, run.weight_decay, run.momentum,
                                                    grad_sq_at_unit_norm=grad_sq)
            elif "elements" in w and w.elements.notna().any():
                predicted = theory.equilibrium_norm(run.optim, run.lr, run.weight_decay,
                                                    elements=int(w.elements.iloc[0]))
            else:
                predicted = None
            if predicted:
                ratios.append(w.weight_norm.mean() / predicted)
        out.append({"run": run.run, "optim": run.optim, "lr": run.lr, "weight_decay": run.weight_decay,
                    "lr_x_wd": run.lr * run.weight_decay, "window_from": start,
                    "predicted": run.theory_angular_update, "measured": measured,
                    "ratio": measured / run.theory_angular_update,
                    "other_weights": other[other.step >= start].angular_update.mean(),
                    "time_constant": run.theory_time_constant, "time_to_equilibrium": settle,
                    "norm_ratio": float(np.mean(ratios)) if ratios else float("nan")})
    return pd.DataFrame(out)


# The approach to equilibrium that smd_convergence fits: from the first probe step whose squared
# norm is within RATE_FROM of its equilibrium value (near enough for the linearised rate) to the
# last before it comes within RATE_TO (below, the norm's own scatter at equilibrium takes over),
# on at least RATE_POINTS probe steps.
RATE_FROM, RATE_TO, RATE_POINTS = 0.5, 0.05, 5


def smd_convergence(runs: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """Wan et al. 2021 Theorems 1-2: with weight decay the squared norm u = ||w||^2 of a
    scale-invariant weight converges to its equilibrium u* at a linear rate, |u_t - u*| shrinking
    by e every time constant (theory.time_constant). Per run with a predicted equilibrium and per
    scale-invariant weight: u* the mean of u over the equilibrium window (smd_window_start), the
    gap |u_t - u*| / u* at each probe step, and over the steps from the first whose gap is at most
    RATE_FROM to the last before the first at most RATE_TO (RATE_POINTS of them at least; else no
    fit), the least-squares line of log(gap) on the step: its time constant -1 / slope and R^2.
    One row per run: of its fitted weights, the time constant over the theory's furthest from 1
    (in ratio), the lowest R^2, and how many weights were fitted of how many; what the theorems
    assume and the fit needs: `scale_drift`, the largest |ln| of a fitted weight's mean E||g~||^2
    over its approach against over the equilibrium window (the theorems hold it constant), and
    `span_probes`, how many probe spacings the theory's approach spans (rate_span)."""
    out = []
    weights = layers.dropna(subset=["weight_norm"]) if "weight_norm" in layers else layers.iloc[0:0]
    for _, run in runs.dropna(subset=["theory_time_constant"]).iterrows():
        rows = weights[weights.run == run.run]
        rows = rows[is_scale_invariant(rows)]
        if rows.empty:
            continue
        start = smd_window_start(run.theory_time_constant, run.steps_done)
        ratios, r2s, drifts, count = [], [], [], 0
        for _, w in rows.groupby(["stack", "layer", "sublayer", "param"], dropna=False):
            count += 1
            w = w.sort_values("step")
            u = w.weight_norm.to_numpy(dtype=float) ** 2
            steps = w.step.to_numpy(dtype=float)
            u_eq = u[steps >= start].mean()
            gap = np.abs(u - u_eq) / u_eq
            near = np.flatnonzero(gap <= RATE_FROM)
            if not len(near):
                continue
            first = near[0]
            reached = np.flatnonzero(gap[first:] <= RATE_TO)
            last = first + (reached[0] if len(reached) else len(gap) - first)
            if last - first < RATE_POINTS:
                continue
            fit = least_squares(steps[first:last], np.log(gap[first:last]))
            if fit["slope"] >= 0:
                ratios.append(float("inf"))  # no approach at all in the window
            else:
                ratios.append(-1.0 / fit["slope"] / run.theory_time_constant)
            r2s.append(fit["r2"])
            if "grad_norm" in w:
                # The theorems' E||g~||^2, the gradient's size at unit norm: (||grad|| ||w||)^2 for
                # a scale-invariant weight; over the fitted approach against the equilibrium window.
                scale = (pd.to_numeric(w.grad_norm, errors="coerce").to_numpy(float) * w.weight_norm.to_numpy(float)) ** 2
                approach, settled = np.nanmean(scale[first:last]), np.nanmean(scale[steps >= start])
                drift = abs(float(np.log(approach / settled)))
                if np.isfinite(drift):  # a weight without a gradient norm has none to tell
                    drifts.append(drift)
        worst = max(ratios, key=lambda r: abs(np.log(r))) if ratios else float("nan")
        spacing = float(np.median(np.diff(np.unique(rows.step.to_numpy(float))))) if rows.step.nunique() > 1 else float("nan")
        out.append({"run": run.run, "optim": run.optim, "lr": run.lr, "weight_decay": run.weight_decay,
                    "time_constant": run.theory_time_constant, "rate_ratio": worst,
                    "rate_r2": min(r2s) if r2s else float("nan"), "fitted": len(ratios), "weights": count,
                    "scale_drift": max(drifts) if drifts else float("nan"),
                    "span_probes": rate_span(run.theory_time_constant) / spacing})
    return pd.DataFrame(out)


def rate_span(time_constant: float) -> float:
    """Steps the theory's approach takes from a gap of RATE_FROM to RATE_TO: ln(RATE_FROM / RATE_TO)
    time constants. A fit of the rate needs RATE_POINTS probe steps inside it."""
    return float(np.log(RATE_FROM / RATE_TO) * time_constant)


def preln_stream_growth(layers: pd.DataFrame) -> pd.DataFrame:
    """Xiong et al. 2020 (arXiv 2002.04745, Sec. 3): in Pre-LN at init E||x_l||^2 grows linearly in l.
    Per stack of the deepest Pre-LN models: the linear fit of the mean squared LN input norm (the
    residual stream entering each sublayer) on the sublayer position, with R^2."""
    rows = layers[(layers.step == 0) & (layers.group == "preln")].dropna(subset=["ln_input_norm"])
    if "param" in rows:
        rows = rows[rows.param.isna()]
    if rows.empty:
        return pd.DataFrame()
    rows = rows[rows.depth == rows.depth.max()].copy()
    rows["position"] = rows.groupby(["run", "stack"]).cumcount() + 1
    out = []
    for stack, r in rows.groupby("stack"):
        r = r.assign(sq=r.ln_input_norm ** 2)
        mean_sq = r.groupby("position").sq.mean()
        fit = least_squares(mean_sq.index, mean_sq.values)
        per_run = spread(least_squares(x.position, x.sq)["r2"] for _, x in r.groupby("run"))
        out.append({"stack": stack, "depth": int(r.depth.iloc[0]), "sublayers": len(mean_sq),
                    "first": mean_sq.iloc[0], "last": mean_sq.iloc[-1], "slope": fit["slope"], "r2": fit["r2"],
                    "runs": per_run["n"], "run_r2": f"{per_run['min']:.3f}-{per_run['max']:.3f}"})
    return pd.DataFrame(out)


# --- Admin Theorem 1: where the gradient vanishes at init ---------------------------------

def output_gradients(layers: pd.DataFrame) -> pd.DataFrame:
    """Per run and residual sublayer at init: the gradient norm of the sublayer's output
    (`output_grad_norm`) divided by the largest of the run's network, both stacks together, with
    `index` the sublayer's position from the bottom of its stack."""
    columns = ["run", "group", "depth", "seed", "stack", "layer", "sublayer", "index", "relative"]
    if layers.empty or "output_grad_norm" not in layers:
        return pd.DataFrame(columns=columns)
    rows = layers[layers.step == 0].dropna(subset=["output_grad_norm"])
    if "param" in rows:
        rows = rows[rows.param.isna()]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    largest = rows.groupby("run").output_grad_norm.transform("max")
    rows = rows.assign(relative=rows.output_grad_norm / largest,
                       index=rows.groupby(["run", "stack"]).cumcount() + 1)
    return rows[columns].reset_index(drop=True)


def vanishing_table(gradients: pd.DataFrame) -> pd.DataFrame:
    """Per group, depth and stack, over seeds: the relative output gradient of the stack's bottom
    layer (mean over its sublayers) and top layer, the smallest in the stack, and per kind of
    sublayer the factor the gradient keeps across one (the gradient at its input, which is the
    output of the sublayer below, over the gradient at its output; geometric mean over the
    stack's sublayers of that kind and over runs; below 1 it shrinks going down)."""
    out = []
    for (group, depth, stack), rows in gradients.groupby(["group", "depth", "stack"]):
        per_run, drops = [], []
        for _, run in rows.groupby("run"):
            run = run.sort_values("index")
            per_run.append({"bottom": run[run.layer == run.layer.min()].relative.mean(),
                            "top": run[run.layer == run.layer.max()].relative.mean(),
                            "smallest": run.relative.min()})
            below = run.relative.shift(1)
            drops.append(pd.DataFrame({"sublayer": run.sublayer, "log_keep": np.log(below / run.relative)}).dropna())
        frame, drop = pd.DataFrame(per_run), pd.concat(drops)
        keep = np.exp(drop.groupby("sublayer").log_keep.mean())
        bottom = spread(frame.bottom)
        out.append({"group": group, "depth": int(depth), "stack": stack, "runs": len(frame),
                    "bottom": bottom["mean"], "bottom_range": f"{bottom['min']:.3g}-{bottom['max']:.3g}",
                    "top": frame.top.mean(), "smallest": frame.smallest.mean(),
                    "kept_across": ", ".join(f"{k} {v:.3g}" for k, v in keep.items())})
    return pd.DataFrame(out)


# --- Admin's residual dependency (probes/dependency.py) ------------------------------------

def dependency_summary(dependency: pd.DataFrame) -> pd.DataFrame:
    """Per group, depth, stack and moment (init: step 0; end: the run's last step), over runs:
    beta_ii (each sublayer's dependency on its own branch) at the second sublayer, its mean over
    sublayers 2..n and at the last one; beta_n0 (the last sublayer's dependency on the
    embedding); and the mean over sublayers of sum_j beta_ij^2 (1 for orthogonal parts)."""
    columns = ["group", "depth", "stack", "when", "runs", "sublayers", "own_at_2", "own_mean", "own_at_last",
               "embedding_at_last", "sum_sq"]
    if dependency.empty:
        return pd.DataFrame(columns=columns)
    last = dependency.groupby("run").step.transform("max")
    frame = dependency.assign(when=np.where(dependency.step == 0, "init", np.where(dependency.step == last, "end", "")))
    frame = frame[frame.when != ""]
    out = []
    for (group, depth, stack, when), rows in frame.groupby(["group", "depth", "stack", "when"], sort=False):
        own = rows[rows.component == rows.sublayer]
        n = int(rows.sublayer.max())
        sum_sq = rows.assign(sq=rows.beta ** 2).groupby(["run", "sublayer"]).sq.sum()
        out.append({"group": group, "depth": int(depth), "stack": stack, "when": when, "runs": rows.run.nunique(),
                    "sublayers": n, "own_at_2": own[own.sublayer == 2].beta.mean(),
                    "own_mean": own[own.sublayer >= 2].beta.mean(), "own_at_last": own[own.sublayer == n].beta.mean(),
                    "embedding_at_last": rows[(rows.sublayer == n) & (rows.component == 0)].beta.mean(),
                    "sum_sq": sum_sq.mean()})
    return pd.DataFrame(out, columns=columns)


# --- Admin's (lr, beta2) grid without warm-up ----------------------------------------------

def grid_counts(runs: pd.DataFrame) -> pd.DataFrame:
    """Per group and decade of lr in an lr sweep: cells, how many diverged (the run's rule) and
    completed, and against Pre-LN (same preset, lr and other settings) in how many of its
    completed cells the group's final eval loss is the lower one (both completed; a cell where
    Pre-LN ran twice with configs that differ has no one Pre-LN to compare with)."""
    runs = runs.assign(setting=runs.apply(run_setting, axis=1).map(_without_group),
                       decade=np.floor(np.log10(runs.lr.astype(float)) + 1e-9).astype(int),
                       preset=_labels(runs, ("experiment", "scale")))
    preln = runs[runs.group == "preln"].set_index(["preset", "setting", "lr"])
    preln = preln[~preln.index.duplicated(keep=False)]
    out = []
    for (group, decade), rows in runs.groupby(["group", "decade"]):
        done = rows[rows.status == "completed"]
        wins = both = 0
        for _, r in done.iterrows():
            key = (r.preset, r.setting, r.lr)
            if group != "preln" and key in preln.index and preln.loc[key].status == "completed":
                both += 1
                wins += int(r.final_eval_loss < preln.loc[key].final_eval_loss)
        out.append({"group": group, "lrs": f"{rows.lr.min():g}-{rows.lr.max():g}", "cells": len(rows),
                    "diverged": int((rows.status == "diverged").sum()), "completed": len(done),
                    "below_preln": f"{wins} of {both}" if group != "preln" else "-"})
    return pd.DataFrame(out)


def _without_group(setting: str) -> str:
    return " ".join(part for part in setting.split() if not part.startswith("group="))


# --- Admin Theorem 2 along one deep encoder (Transformer-Clinic's protocol) ----------------

def spread(values) -> Dict[str, float]:
    """Mean, sample standard deviation, min and max of a value measured once per seed."""
    v = np.asarray(list(values), dtype=float)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else float("nan"),
            "min": float(v.min()), "max": float(v.max()), "n": int(len(v))}


def encoder_input_change(layers: pd.DataFrame) -> pd.DataFrame:
    """Per run: the change of each encoder sublayer's std-normalised input under Admin's
    perturbation at init, with i = 1..2N its position from the bottom (sublayer i's input is the
    output of i - 1 sublayers; i = 1 is the embedding). The encoder's inputs do not depend on the
    decoder, so every encoder-decoder run gives one curve (Liu et al. 2020, Fig. 4, as
    Transformer-Clinic's `--plot_stability` measures it; docs/methods.md, "Fits and LR
    sensitivity")."""
    columns = ["run", "group", "model", "depth", "seed", "index", "input_change"]
    if layers.empty or "input_change" not in layers:
        return pd.DataFrame(columns=columns)
    rows = layers[(layers.step == 0) & (layers["stack"] == "encoder")].dropna(subset=["input_change"])
    if "param" in rows:
        rows = rows[rows.param.isna()]
    rows = rows.assign(index=rows.groupby("run").cumcount() + 1)
    return rows[columns].reset_index(drop=True)


def clinic_fits(curves: pd.DataFrame) -> pd.DataFrame:
    """Per model width and group, on the deepest encoder: the curves averaged over runs (seeds),
    then fitted linear in i and log in i over every i; the same two fits of each run alone give
    the R^2 range across seeds."""
    out = []
    for (model, group), rows in curves.groupby(["model", "group"]):
        rows = rows[rows.depth == rows.depth.max()]
        if rows["index"].nunique() < 3:
            continue
        mean = rows.groupby("index").input_change.mean()
        fits = linear_and_log_fits(mean.index, mean.values)
        per_run = [linear_and_log_fits(r["index"], r.input_change) for _, r in rows.groupby("run")]
        linear = spread(f["linear"]["r2"] for f in per_run)
        log = spread(f["log"]["r2"] for f in per_run)
        out.append({"model": model, "group": group, "runs": len(per_run), "sublayers": int(mean.index.max()),
                    "change_at_1": mean.iloc[0], "change_at_last": mean.iloc[-1],
                    "linear_r2": fits["linear"]["r2"], "log_r2": fits["log"]["r2"],
                    "seed_linear_r2": f"{linear['min']:.3f}-{linear['max']:.3f}",
                    "seed_log_r2": f"{log['min']:.3f}-{log['max']:.3f}",
                    "linear_slope": fits["linear"]["slope"], "linear_intercept": fits["linear"]["intercept"],
                    "log_slope": fits["log"]["slope"], "log_intercept": fits["log"]["intercept"]})
    return pd.DataFrame(out)


def clinic_ratio(curves: pd.DataFrame, top: str = "postln", bottom: str = "preln") -> pd.DataFrame:
    """Per model width: `top` / `bottom` at the last sublayer of the deepest encoder, from the
    curves averaged over seeds, and its range over seeds (runs paired by seed)."""
    out = []
    for model, rows in curves.groupby("model"):
        rows = rows[rows.depth == rows.depth.max()]
        last = rows[rows["index"] == rows["index"].max()]
        a, b = (last[last.group == g].set_index("seed").input_change for g in (top, bottom))
        if a.empty or b.empty:
            continue
        paired = (a / b).dropna()
        s = spread(paired) if len(paired) else {"min": float("nan"), "max": float("nan")}
        out.append({"model": model, "sublayers": int(last["index"].iloc[0]), "ratio": a.mean() / b.mean(),
                    "seed_range": f"{s['min']:.1f}-{s['max']:.1f}", "seeds": len(paired)})
    return pd.DataFrame(out)


def lr_sensitivity(final_losses, loss_0: float) -> float:
    """LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322, Sec. 2.2):
    E_eta[min(loss(eta), loss_0) - loss*] over the grid of learning rates eta (a log grid, so
    the plain mean over its points), loss_0 the loss at init and loss* the best final loss over
    the grid. A diverged run (NaN or inf) counts as loss_0. NaN when no run has a finite loss."""
    x = np.asarray(final_losses, dtype=float)
    if not np.isfinite(x).any():
        return float("nan")
    clipped = np.where(np.isfinite(x), np.minimum(x, loss_0), loss_0)
    return float((clipped - clipped.min()).mean())


# A sweep's cell, its preset, or what config.run_name leaves out of a folder's name (what to do
# with the folder, where the run is watched), or the device it computes on (the same numbers, to
# float rounding: a GPU call's runs of a preset are that preset's runs): none of them changes
# what a run measures.
NOT_A_SETTING = ("group=", "depth=", "seed=", "experiment=", "scale=", "overwrite=", "logger=", "logger.",
                 "train.device=")


def setting(overrides, besides=()) -> str:
    """A run's overrides ("__"-joined, as in Hydra's record or a run folder's name) other than
    its cell's (group, depth, seed), its preset's (experiment, scale) and the `besides` keys'
    ("" when none): what it changes of the recipe."""
    if not isinstance(overrides, str):
        return ""
    drop = NOT_A_SETTING + tuple(f"{key}=" for key in besides)
    # A part without "=" is no override: a folder named by hand (a monitor's "gpt2_4L").
    return " ".join(p for p in overrides.split("__") if "=" in p and not p.startswith(drop))


def run_overrides(run: pd.Series) -> str:
    """A collected run's overrides: as recorded, else from its folder's name (which is cut and
    hashed when long, so only the fallback)."""
    overrides = run.get("overrides")
    return overrides if isinstance(overrides, str) else str(run.run).replace("\\", "/").rsplit("/", 1)[-1]


def run_settings(runs: pd.DataFrame) -> pd.Series:
    """Each collected run's setting besides its lr (`setting`; "(defaults)" for none): the runs of
    one (group, depth) that differ here ran different recipes and are not averaged together."""
    if runs.empty:
        return pd.Series(dtype=object)
    return runs.apply(lambda run: setting(run_overrides(run), besides=("train.lr",)) or "(defaults)", axis=1)


def lr_setting(overrides: str) -> str:
    """What a run of an lr sweep holds fixed besides the lr (its group and depth included)."""
    kept = [p for p in str(overrides).split("__") if not p.startswith(("train.lr=", "experiment=", "scale="))]
    return " ".join(kept) or "(defaults)"


def run_setting(run: pd.Series) -> str:
    """lr_setting of a collected run."""
    return lr_setting(run_overrides(run))


def lr_sensitivity_table(runs: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (lr_setting) and lr: the final eval loss (NaN: diverged or
    unfinished), the eval loss at init (step 0), and the setting's LR sensitivity."""
    init = metrics[metrics.step == 0].set_index("run")["eval_loss"] if "eval_loss" in metrics else pd.Series(dtype=float)
    rows = []
    for _, r in runs.iterrows():
        final = r.final_eval_loss if r.status == "completed" and pd.notna(r.final_eval_loss) else float("nan")
        rows.append({"run": r.run, "setting": run_setting(r), "lr": float(r.lr), "final_eval_loss": float(final),
                     "status": r.status, "loss_0": init.get(r.run, float("nan")),
                     **{key: r.get(key) for key in ("experiment", "scale", "sweep")}})
    table = pd.DataFrame(rows)
    table = table.assign(setting=_told_apart(table)).drop(columns=["experiment", "scale", "sweep"])
    table = table.sort_values(["setting", "lr"])
    sensitivity = {s: lr_sensitivity(t.final_eval_loss, t.loss_0.mean()) for s, t in table.groupby("setting")}
    table["lr_sensitivity"] = table.setting.map(sensitivity)
    return table.reset_index(drop=True)


def _told_apart(table: pd.DataFrame) -> pd.Series:
    """The settings of a table of runs (setting, lr, experiment, scale, sweep), each lr at most
    once per setting: where two runs of a setting share an lr (sweeps of two presets, or of one
    preset at two scales, in one folder; one command run twice with configs that differ), every
    run of that setting is told apart by its preset, failing that by its sweep folder. One
    config run twice is one run, for the caller to count once (stabexp report does)."""
    settings = table.setting
    for keys in (("experiment", "scale"), ("sweep",)):
        clash = table.assign(setting=settings).duplicated(["setting", "lr"], keep=False)
        if not clash.any():
            break
        mixed = settings.isin(settings[clash])
        settings = settings.where(~mixed, (_labels(table, keys) + " " + settings).str.strip())
    return settings


def _labels(runs: pd.DataFrame, keys) -> pd.Series:
    """Per run, "key=value" of the `keys` it has a value of, space-joined."""
    return pd.Series([" ".join(f"{k}={r.get(k)}" for k in keys if pd.notna(r.get(k))) for _, r in runs.iterrows()],
                     index=runs.index, dtype=object)


def setting_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per group, depth and setting (what a run's overrides change besides group, depth, seed,
    lr, experiment and scale, e.g. "robustness=lr_x0.5"; "(defaults)" for none), over its
    completed runs: the mean final eval loss and test BLEU, and per group and depth the spread
    (largest minus smallest) of the settings' losses. DeepNet Fig. 7 changes one
    hyper-parameter at a time and reads how far the result moves."""
    columns = ["group", "depth", "setting", "runs", "final_eval_loss", "test_bleu", "spread"]
    done = runs[runs.status == "completed"]
    if done.empty:
        return pd.DataFrame(columns=columns)
    settings = run_settings(done)
    bleu = done.test_bleu if "test_bleu" in done else pd.Series(np.nan, index=done.index)
    frame = pd.DataFrame({"group": done.group, "depth": done.depth, "setting": settings,
                          "final_eval_loss": done.final_eval_loss, "test_bleu": bleu})
    table = (frame.groupby(["group", "depth", "setting"], sort=False)
             .agg(runs=("final_eval_loss", "size"), final_eval_loss=("final_eval_loss", "mean"),
                  test_bleu=("test_bleu", "mean")).reset_index())
    by_cell = table.groupby(["group", "depth"]).final_eval_loss
    table["spread"] = by_cell.transform("max") - by_cell.transform("min")
    return table[columns]


# --- DeepNet's bound on the model update (probes/update_bound.py) --------------------------

def update_bound_steps(metrics: pd.DataFrame, bound: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run and probe step: DeepNet's right-hand side (`bound` in the operator-norm reading,
    `bound_gain` in the Xavier-gain one), the measured model update relative to ||F(x, theta_0)||
    per token, and bound / measured (>= 1: the bound holds).

    A single stack sums its sublayers' terms (Theorem 4.1). An encoder-decoder run (rows of both
    stacks) is Theorem 4.3's: the decoder's terms, plus the encoder's sum (`encoder_bound`) times
    `cross_gain`, sum over the cross-attentions of v w / alpha_d (probes/update_bound.py).

    A step without a finite measured update has no row: the model blew up there (a diverged
    run), or the run's summary does not hold ||F(x, theta_0)|| yet (written at its first
    checkpoint), or its metrics.csv is gone."""
    columns = ["run", "group", "depth", "seed", "step", "bound", "bound_gain", "measured", "ratio", "ratio_gain",
               "encoder_bound", "cross_gain"]
    if bound.empty or "model_update" not in metrics:
        return pd.DataFrame(columns=columns)
    keys = ["run", "group", "depth", "seed", "step"]
    two_stacks = bound.groupby("run")["stack"].transform("nunique") > 1
    sums = {}
    for suffix in ("", "_gain"):
        # The encoder's sum is what a two-stack run's cross-attentions carry; a single stack's
        # rows (whatever its stack is called) all add to the bound directly.
        inner = bound[two_stacks & (bound["stack"] == "encoder")].groupby(keys)[f"term{suffix}"].sum()
        outer = bound[~(two_stacks & (bound["stack"] == "encoder"))].groupby(keys)[f"term{suffix}"].sum()
        cross = bound[bound.sublayer == "cross_attn"]
        gain = (cross[f"v{suffix}"] * cross[f"w{suffix}"] / cross.alpha).groupby([cross[k] for k in keys]).sum()
        sums[f"bound{suffix}"] = outer.add(inner * gain, fill_value=0)
        if not suffix:  # Theorem 4.3's two factors, in the operator-norm reading
            sums["encoder_bound"], sums["cross_gain"] = inner, gain
    frame = pd.DataFrame(sums).reset_index()
    norm = pd.to_numeric(runs.set_index("run").get("features_init_norm", pd.Series(dtype=float)), errors="coerce")
    update = metrics[["run", "step", "model_update"]].dropna()
    frame = frame.merge(update, on=["run", "step"])
    frame = frame.assign(measured=frame.model_update / frame.run.map(norm).astype(float))
    frame = frame[(frame.step > 0) & np.isfinite(frame.measured)]
    return pd.DataFrame({"run": frame.run, "group": frame.group, "depth": frame.depth, "seed": frame.seed,
                         "step": frame.step, "bound": frame.bound, "bound_gain": frame.bound_gain,
                         "measured": frame.measured, "ratio": frame.bound / frame.measured,
                         "ratio_gain": frame.bound_gain / frame.measured, "encoder_bound": frame.encoder_bound,
                         "cross_gain": frame.cross_gain}, columns=columns)


def update_bound_table(steps: pd.DataFrame, at=(1, 10, 100)) -> pd.DataFrame:
    """Per group and depth (mean over seeds): the bound and the measured relative update at
    the steps `at` (those probed), and over every probe step the smallest bound / measured in both
    readings: the bound holds where min_ratio >= 1."""
    columns = ["group", "depth", "runs", *(f"{what}_{step}" for step in at for what in ("bound", "measured")),
               "min_ratio", "median_ratio", "min_ratio_gain"]
    out = []
    for (group, depth), rows in steps.groupby(["group", "depth"], sort=False):
        row = {"group": group, "depth": int(depth), "runs": rows.run.nunique()}
        for step in at:
            here = rows[rows.step == step]
            row[f"bound_{step}"] = here.bound.mean() if not here.empty else np.nan
            row[f"measured_{step}"] = here.measured.mean() if not here.empty else np.nan
        row.update(min_ratio=rows.ratio.min(), median_ratio=rows.ratio.median(), min_ratio_gain=rows.ratio_gain.min())
        out.append(row)
    return pd.DataFrame(out, columns=columns)


# --- DeepNet Fig. 8: is deeper better? ------------------------------------------------------

def depth_law(runs: pd.DataFrame, value: str = "final_eval_loss") -> pd.DataFrame:
    """Per group, over its completed runs: least squares value = A ln(depth) + B (DeepNet Fig. 8
    fits BLEU that way), R^2, the depths used, and the depth of the best (lowest) mean value."""
    out = []
    for group, rows in runs[runs.status == "completed"].dropna(subset=[value]).groupby("group", sort=False):
        means = rows.groupby("depth")[value].mean()
        if len(means) < 2:
            continue
        fit = least_squares(np.log(means.index.to_numpy(float)), means.to_numpy(float))
        out.append({"group": group, "depths": ",".join(str(int(d)) for d in means.index), "A": fit["slope"],
                    "B": fit["intercept"], "r2": fit["r2"], "best_depth": int(means.idxmin()), "best": means.min()})
    return pd.DataFrame(out)


# --- The stabilisers of 2024-2025: layer importance, stream norm, attention logits -----------

def layer_importance_table(importance: pd.DataFrame, cheap: float = 0.01) -> pd.DataFrame:
    """Per group, depth and stack at the last step (mean over the runs of the cell), from
    layer_importance.csv: the mean eval-loss increase of skipping a layer of the bottom half and
    of the top half of the stack, the largest increase, and the share of layers whose skip costs
    less than `cheap` nats ("The Curse of Depth": in Pre-LN most deep layers can go)."""
    columns = ["group", "depth", "stack", "runs", "bottom_half", "top_half", "largest", "cheap_share"]
    if importance.empty:
        return pd.DataFrame(columns=columns)
    last = importance[importance.step == importance.groupby("run").step.transform("max")]
    last = last[last.step > 0]
    out = []
    for (group, depth, stack), rows in last.groupby(["group", "depth", "stack"], sort=False):
        per_layer = rows.groupby("layer").loss_increase.mean()
        half = per_layer.index <= per_layer.index.max() / 2
        out.append({"group": group, "depth": int(depth), "stack": stack, "runs": rows.run.nunique(),
                    "bottom_half": per_layer[half].mean(), "top_half": per_layer[~half].mean(),
                    "largest": per_layer.max(), "cheap_share": float((per_layer < cheap).mean())})
    return pd.DataFrame(out, columns=columns)


def stream_growth(layers: pd.DataFrame) -> pd.DataFrame:
    """Per group, depth and stack at the last probe step (mean over the runs of the cell): the
    residual stream's norm per token (stream_norm) entering the stack's first and last sublayer,
    and their ratio: Pre-LN's hidden state grows with depth, Peri-LN's stays bounded (Kim et
    al. 2025)."""
    columns = ["group", "depth", "stack", "runs", "first", "last", "growth"]
    if "stream_norm" not in layers or layers.stream_norm.isna().all():
        return pd.DataFrame(columns=columns)
    rows = layers.dropna(subset=["stream_norm"])
    if "param" in rows:
        rows = rows[rows.param.isna()]
    rows = rows[rows.step == rows.groupby("run").step.transform("max")]
    out = []
    for (group, depth, stack), cell in rows.groupby(["group", "depth", "stack"], sort=False):
        ends = cell.groupby("run").stream_norm.agg(["first", "last"])
        out.append({"group": group, "depth": int(depth), "stack": stack, "runs": len(ends),
                    "first": ends["first"].mean(), "last": ends["last"].mean(),
                    "growth": (ends["last"] / ends["first"]).mean()})
    return pd.DataFrame(out, columns=columns)


def final_max_logit(layers: pd.DataFrame) -> pd.Series:
    """Per run: the largest attention logit over its sublayers at its last probe step."""
    if "max_attn_logit" not in layers:
        return pd.Series(dtype=float)
    rows = layers.dropna(subset=["max_attn_logit"])
    rows = rows[rows.step == rows.groupby("run").step.transform("max")]
    return rows.groupby("run").max_attn_logit.max()


# --- convergence: has a run stopped improving? -----------------------------------------------

# The last stretch of a run over which its metric must have stopped moving for its final value to
# stand for what the model reaches: the last quarter of its steps.
LAST_STRETCH = 0.25


def last_stretch_change(steps, values, last: float = LAST_STRETCH) -> float:
    """How much a metric moved over the last `last` of a run: its final evaluation less the one at
    or before step (1 - last) x the final step (positive where it rose). NaN with fewer than two
    evaluations in reach, or none at or before that step other than the final one."""
    frame = pd.DataFrame({"step": np.asarray(steps, dtype=float), "value": np.asarray(values, dtype=float)})
    frame = frame.dropna().sort_values("step")
    if len(frame) < 2:
        return float("nan")
    end = frame.step.iloc[-1]
    before = frame[(frame.step <= (1 - last) * end) & (frame.step < end)]
    if before.empty:
        return float("nan")
    return float(frame.value.iloc[-1] - before.value.iloc[-1])
