"""The numbers the claims read, one set per finished run, and where they are kept.

From run folders: every finished run (completed or diverged) under a folder is collected
(plotting/collect.py) and reduced to named scalars (`measures`: its final losses and BLEU, the
model update at steps 1, 10 and 30, the fits' inputs at init, the probes' summaries), each
computed by the function of stabexp.analysis that the report and the figures use, so a claim
and a figure cannot read a run differently.

Recorded: run folders do not outlive a machine, so `stabexp claims --record FILE` keeps those
scalars as a long table (one row per run and measure) that is committed under docs/data/ and read
back on a fresh clone. The tables of finished cells that cells.py keeps (docs/data/*_cells.csv)
are read as evidence too: their final losses and BLEU are measures of the same kind.

A run's key is (recipe, scale, group, depth, decoder_depth, seed, setting): `recipe` is its preset,
or the preset whose runs it repeats (RECIPE_OF), `setting` its overrides besides its cell's and
preset's (analysis.setting). Sources are merged measure by measure: a run folder's value wins over
a recorded one, a recorded over a cells table's.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Iterable, List, Tuple

import numpy as np
import pandas as pd

from stabexp.analysis import (encoder_input_change, final_max_logit, is_scale_invariant, last_stretch_change,
                              last_w2_grad, least_squares, linear_and_log_fits, output_gradients, setting,
                              smd_convergence, smd_equilibrium, update_bound_steps)
from stabexp.claims.registry import normal_setting
from stabexp.errors import ConfigError
from stabexp.plotting.collect import Tables, collect

log = logging.getLogger("stabexp")

KEY = ["recipe", "scale", "group", "depth", "decoder_depth", "seed", "setting"]
RECORD_COLUMNS = KEY + ["task", "status", "date", "measure", "value"]
FINISHED = ("completed", "diverged")

# Presets whose runs are another preset's runs (same recipe, more groups or depths, a probe that
# does not change the training): their cells are one table.
RECIPE_OF = {"deepnet_depth_law": "lm_depth", "deepnet_lm_depth": "lm_depth", "curse_of_depth": "lm_depth",
             "deepnet_bleu_depth": "multi30k_table", "admin_rezero": "multi30k_table"}

# Columns of summary.json (collect's runs table) kept as measures.
SUMMARY_MEASURES = ("final_eval_loss", "final_eval_acc", "test_loss", "test_bleu", "steps_done", "diverged_at_step",
                    "chance_loss", "unigram_eval_loss", "position_only_eval_loss", "source_counts_eval_loss", "lr",
                    "grad_scaling_error")
UPDATE_STEPS = (1, 2, 10, 29, 30)


def translation_tasks() -> Tuple[str, ...]:
    """The task presets of kind translation (conf/task), by the name their runs record."""
    from omegaconf import OmegaConf

    from stabexp.paths import conf_dir

    tasks = (OmegaConf.load(path).get("task") or {} for path in sorted((conf_dir() / "task").glob("*.yaml")))
    return tuple(t["name"] for t in tasks if t.get("kind") == "translation")


TRANSLATION_TASKS = translation_tasks()
# A run "trains" when its final eval loss beats the rule that ignores the input (the unigram model
# on text, each position's symbol frequencies on sort and reverse) by this much, or, on
# translation, when its test BLEU reaches TRAINED_BLEU; a diverged run never does.
TRAINED_MARGIN = 0.05
TRAINED_BLEU = 1.0


def _per_run(frame: pd.DataFrame, column: str, name: str) -> pd.DataFrame:
    return frame[["run", column]].dropna().rename(columns={column: "value"}).assign(measure=name)


def _model_updates(metrics: pd.DataFrame) -> List[pd.DataFrame]:
    if metrics.empty or "model_update" not in metrics:
        return []
    rows = metrics.dropna(subset=["model_update"])
    return [_per_run(rows[rows.step == k], "model_update", f"model_update@{k}") for k in UPDATE_STEPS]


def _gradient_mean(metrics: pd.DataFrame) -> List[pd.DataFrame]:
    """DeepNet Fig. 3, per run: the whole model's gradient norm, its mean over the probe steps after init."""
    if metrics.empty or "grad_norm" not in metrics:
        return []
    trained = metrics[metrics.step >= 1].assign(grad_norm=lambda m: pd.to_numeric(m.grad_norm, errors="coerce"))
    trained = trained.dropna(subset=["grad_norm"])
    return [_per_run(trained.groupby("run").grad_norm.mean().reset_index(), "grad_norm", "grad_norm_mean")]


# The curves a run's convergence is read from, and the measure each gives (analysis.last_stretch_change).
CONVERGENCE = {"eval_loss": "eval_loss_last_change", "valid_bleu": "valid_bleu_last_change"}


def _convergence(curves: pd.DataFrame, keys) -> List[pd.DataFrame]:
    """Per run (rows grouped by `keys`): how far each eval curve moved over its last quarter."""
    out = []
    for column, name in CONVERGENCE.items():
        if column not in curves:
            continue
        rows = curves.assign(**{column: pd.to_numeric(curves[column], errors="coerce")}).dropna(subset=[column])
        if rows.empty:
            continue
        change = rows.groupby(keys).apply(lambda r: last_stretch_change(r.step, r[column]), include_groups=False)
        out.append(change.dropna().rename("value").reset_index().assign(measure=name))
    return out


def _at_init(metrics: pd.DataFrame, layers: pd.DataFrame) -> List[pd.DataFrame]:
    out = []
    if not metrics.empty:
        init = metrics[metrics.step == 0]
        for column, name in (("eval_loss", "eval_loss@0"), ("output_change", "output_change")):
            if column in init:
                out.append(_per_run(init, column, name))
        if "log_z_mean" in metrics:
            z = metrics.dropna(subset=["log_z_mean"])
            out.append(_per_run(z[z.step == z.groupby("run").step.transform("max")], "log_z_mean", "final_log_z_mean"))
    if layers.empty:
        return out
    rows = layers[layers.step == 0]
    if "param" in rows:
        rows = rows[rows.param.isna()]
    out.append(rows.groupby("run").size().rename("value").reset_index().assign(measure="sublayers"))
    if "w2_grad_norm" in layers:
        out.append(_per_run(last_w2_grad(layers), "w2_grad_norm", "w2_grad_last"))
    if "ln_input_norm" in rows:
        # Xiong et al.: E||x_l||^2 linear in l. R^2 and slope of that line per run, the worse of its
        # stacks (the smaller R^2, the smaller slope).
        lines = []
        for run, r in rows.dropna(subset=["ln_input_norm"]).groupby("run"):
            fits = [least_squares(np.arange(1, len(s) + 1), s.ln_input_norm.to_numpy() ** 2)
                    for _, s in r.groupby("stack") if len(s) >= 3]
            if fits:
                lines += [{"run": run, "measure": "stream_sq_linear_r2", "value": min(f["r2"] for f in fits)},
                          {"run": run, "measure": "stream_sq_slope", "value": min(f["slope"] for f in fits)}]
        if lines:
            out.append(pd.DataFrame(lines))
    return out


def _clinic(layers: pd.DataFrame) -> List[pd.DataFrame]:
    """Admin Theorem 2 as Transformer-Clinic measures it, per run: R^2 of the encoder's input
    change against the sublayer index i, linear in i and in ln i (analysis.encoder_input_change)."""
    curves = encoder_input_change(layers)
    out = []
    for run, r in curves.groupby("run"):
        if r["index"].nunique() >= 3:
            fits = linear_and_log_fits(r["index"], r.input_change)
            out += [{"run": run, "measure": f"clinic_{shape}_r2", "value": fits[shape]["r2"]} for shape in fits]
            # The curve itself, for the fit of the curve averaged over seeds (the paper's one curve).
            out += [{"run": run, "measure": f"clinic_input_change@{i}", "value": v}
                    for i, v in zip(r["index"], r.input_change)]
    return [pd.DataFrame(out)] if out else []


def _decoder_early(layers: pd.DataFrame) -> List[pd.DataFrame]:
    """DeepNet Fig. 4's middle and right panels, per run: the decoder's mean LN input norm at
    step k over that at init, and its bottom layer's gradient norm over its largest layer's."""
    if layers.empty or "ln_input_norm" not in layers:
        return []
    rows = layers[layers["stack"] == "decoder"]
    if "param" in rows:
        rows = rows[rows.param.isna()]
    out = []
    ln = rows.dropna(subset=["ln_input_norm"]).groupby(["run", "step"]).ln_input_norm.mean().unstack()
    per_layer = _decoder_layer_gradients(layers)
    for k in (1, 30):
        if 0 in ln and k in ln:
            out.append((ln[k] / ln[0]).dropna().rename("value").reset_index().assign(measure=f"ln_input_growth@{k}"))
        at_k = per_layer[per_layer.index.get_level_values("step") == k]
        if not at_k.empty:
            by_run = at_k.groupby(level="run")
            bottom = by_run.apply(lambda s: s.xs(s.index.get_level_values("layer").min(), level="layer").iloc[0])
            out.append((bottom / by_run.max()).rename("value").reset_index().assign(measure=f"grad_bottom_over_top@{k}"))
    return out


# DeepNet Fig. 3's window: the gradient of the top layers over the first 30 updates (v1, Sec. 3).
FIG3_UPDATES = 30


def _decoder_layer_gradients(layers: pd.DataFrame) -> pd.Series:
    """Per (run, step, layer) of the decoder: the layer's gradient norm, its sublayers' norms
    added in squares (the sublayer rows, not the weight rows)."""
    rows = layers[layers["stack"] == "decoder"]
    if "param" in rows:
        rows = rows[rows.param.isna()]
    # Collected beside runs without some columns, the tables can hold numbers as objects.
    rows = rows.assign(sq=pd.to_numeric(rows.grad_norm, errors="coerce") ** 2).dropna(subset=["sq"])
    return np.sqrt(rows.groupby(["run", "step", "layer"]).sq.sum())


def _top_gradient(layers: pd.DataFrame) -> List[pd.DataFrame]:
    """DeepNet Fig. 3, per run: the gradient norm of the decoder's top layer, the mean over the
    probe steps 1..FIG3_UPDATES."""
    if layers.empty or "grad_norm" not in layers:
        return []
    per_layer = _decoder_layer_gradients(layers).reset_index(name="norm")
    window = per_layer[(per_layer.step >= 1) & (per_layer.step <= FIG3_UPDATES)]
    if window.empty:
        return []
    top = window[window.layer == window.groupby("run").layer.transform("max")]
    mean = top.groupby("run").norm.mean()
    return [mean.rename("value").reset_index().assign(measure="decoder_top_grad_mean")]


# DeepNet's account of Post-LN without Post-LN-init (v1 Sec. 3, Fig. 3(c), 4(a)): the decoder's top
# layers settle while the lower stay poorly trained. A layer has settled at the first probe step
# where its distance from init reaches this share of its final distance.
SETTLED = 0.8


def _settling(layers: pd.DataFrame) -> List[pd.DataFrame]:
    """Per run, from each decoder layer's distance from init (probe.init_distance, the mean over its
    sublayers): its lower third's final distance over its top third's
    (`decoder_low_over_top_distance`), and the top third's mean step of settling over the lower
    third's (`decoder_top_over_low_settle`, below 1 where the top settles first)."""
    if layers.empty or "init_distance" not in layers:
        return []
    rows = layers[layers["stack"] == "decoder"]
    if "param" in rows:
        rows = rows[rows.param.isna()]
    rows = rows.assign(d=pd.to_numeric(rows.init_distance, errors="coerce")).dropna(subset=["d"])
    per_layer = rows.groupby(["run", "layer", "step"]).d.mean().reset_index()
    out = []
    for run, r in per_layer.groupby("run"):
        n = int(r.layer.max())
        if n < 3 or r.step.max() <= 0:
            continue
        third = n // 3
        final = r[r.step == r.step.max()].set_index("layer").d
        settled = {layer: float(q[q.d >= SETTLED * final[layer]].step.min()) for layer, q in r.groupby("layer")}
        low, top = range(1, third + 1), range(n - third + 1, n + 1)
        out.append({"run": run, "measure": "decoder_low_over_top_distance",
                    "value": float(final[list(low)].mean() / final[list(top)].mean())})
        out.append({"run": run, "measure": "decoder_top_over_low_settle",
                    "value": float(np.mean([settled[k] for k in top]) / np.mean([settled[k] for k in low]))})
    return [pd.DataFrame(out)] if out else []


def _lemma1(mixing: pd.DataFrame) -> List[pd.DataFrame]:
    """DeepNet's Lemma 1 (probe.attention_mixing), per run, over its attention sublayers: the
    largest gain (output against a typical input) at init and at the end, the largest bound
    (output against the largest input) over both, and the largest mean peak weight at the end."""
    if mixing.empty:
        return []
    end = mixing.groupby("run").step.transform("max")
    at_init, at_end = mixing[mixing.step == 0], mixing[(mixing.step == end) & (mixing.step > 0)]
    return [_per_run(at_init.groupby("run").gain.max().reset_index(), "gain", "attention_gain_max@init"),
            _per_run(at_end.groupby("run").gain.max().reset_index(), "gain", "attention_gain_max@end"),
            _per_run(mixing.groupby("run").bound.max().reset_index(), "bound", "attention_bound_max"),
            _per_run(at_end.groupby("run").peak.max().reset_index(), "peak", "attention_peak_max@end")]


def _spread_over_sublayers(layers: pd.DataFrame, step: int = 30) -> List[pd.DataFrame]:
    """Admin Sec. 3 (Adam evens out the updates), per run at `step`: log10(largest / smallest) over
    every residual sublayer of both stacks of its gradient norm and of its relative update."""
    if layers.empty or "relative_update" not in layers:
        return []
    rows = layers[layers.step == step]
    if "param" in rows:
        rows = rows[rows.param.isna()]
    out = []
    for column, name in (("grad_norm", "grad_log_range"), ("relative_update", "update_log_range")):
        rows = rows.assign(**{column: pd.to_numeric(rows[column], errors="coerce")})
        values = rows[rows[column] > 0].groupby("run")[column]
        spread = np.log10(values.max() / values.min())
        out.append(spread.rename("value").reset_index().assign(measure=f"{name}@{step}"))
    return out


def _vanishing(layers: pd.DataFrame) -> List[pd.DataFrame]:
    """Admin Theorem 1, per run: each stack's bottom-layer output gradient relative to the
    network's largest, and per kind of decoder sublayer the factor kept across one
    (analysis.vanishing_table's quantities, run by run)."""
    grads = output_gradients(layers)
    if grads.empty:
        return []
    out = []
    for (run, stack), r in grads.groupby(["run", "stack"]):
        r = r.sort_values("index")
        out.append({"run": run, "measure": f"{stack}_bottom_gradient", "value": r[r.layer == r.layer.min()].relative.mean()})
        if stack == "decoder":
            keep = np.log(r.relative.shift(1) / r.relative)
            for kind, k in keep.groupby(r.sublayer):
                if k.notna().any():
                    out.append({"run": run, "measure": f"decoder_keep_{kind}", "value": float(np.exp(k.mean()))})
    return [pd.DataFrame(out)]


def _dependency(dependency: pd.DataFrame) -> List[pd.DataFrame]:
    """Admin Sec. 4.1, per run: the encoder's mean beta_ii (sublayers 2..n) at init and at the end."""
    if dependency.empty:
        return []
    enc = dependency[(dependency["stack"] == "encoder") & (dependency.component == dependency.sublayer)
                     & (dependency.sublayer >= 2)]
    last = enc.groupby("run").step.transform("max")
    out = [_per_run(enc[enc.step == 0].groupby("run").beta.mean().reset_index(), "beta", "own_dependency@init"),
           _per_run(enc[(enc.step == last) & (enc.step > 0)].groupby("run").beta.mean().reset_index(), "beta",
                    "own_dependency@end")]
    # Along the stack at init: the change of beta_ii from sublayer 2 to the top on a fitted line,
    # and how alike adjacent sublayers' rows of beta are (their cosine, components j >= 0).
    init = dependency[(dependency["stack"] == "encoder") & (dependency.step == 0)]
    pattern = []
    for run, r in init.groupby("run"):
        own = r[(r.component == r.sublayer) & (r.sublayer >= 2)].sort_values("sublayer")
        if len(own) >= 3:
            fit = least_squares(own.sublayer.to_numpy(float), own.beta.to_numpy(float))
            span = float(own.sublayer.max() - own.sublayer.min())
            pattern.append({"run": run, "measure": "own_dependency_change@init", "value": fit["slope"] * span})
        rows = r[r.component >= 0].pivot_table(index="sublayer", columns="component", values="beta").fillna(0.0)
        if len(rows) >= 2:
            b = rows.to_numpy(float)
            cos = (b[1:] * b[:-1]).sum(1) / (np.linalg.norm(b[1:], axis=1) * np.linalg.norm(b[:-1], axis=1))
            pattern.append({"run": run, "measure": "adjacent_similarity@init", "value": float(np.mean(cos))})
    if pattern:
        out.append(pd.DataFrame(pattern))
    return out


def _late_probes(tables) -> List[pd.DataFrame]:
    out = []
    layers, runs = tables["layers"], tables["runs"]
    logits = final_max_logit(layers) if not layers.empty else pd.Series(dtype=float)
    if not logits.empty:
        out.append(logits.rename("value").reset_index().assign(measure="final_max_attn_logit"))
    if not layers.empty and "stream_norm" in layers:
        rows = layers.dropna(subset=["stream_norm"])
        if "param" in rows:
            rows = rows[rows.param.isna()]
        rows = rows[rows.step == rows.groupby("run").step.transform("max")]
        # One stack per run: the decoder where there is one (analysis.stream_growth's, per stack).
        top = rows.groupby("run")["stack"].transform(lambda s: "decoder" if (s == "decoder").any() else s.iloc[0])
        rows = rows[rows["stack"] == top]
        ends = rows.groupby("run").stream_norm.agg(["first", "last"])
        out.append((ends["last"] / ends["first"]).rename("value").reset_index().assign(measure="stream_growth"))
    importance = tables["layer_importance"]
    if not importance.empty:
        last = importance[(importance.step == importance.groupby("run").step.transform("max")) & (importance.step > 0)]
        share = last.groupby("run").loss_increase.apply(lambda s: float((s < 0.01).mean()))
        out.append(share.rename("value").reset_index().assign(measure="cheap_layer_share"))
    bound = tables["update_bound"]
    if not bound.empty:
        steps = update_bound_steps(tables["metrics"], bound, runs)
        out.append(_per_run(steps.groupby("run").ratio.min().reset_index(), "ratio", "bound_min_ratio"))
        out.append(_per_run(steps[steps.step == 1], "bound", "bound@1"))
    if not layers.empty and "theory_angular_update" in runs and runs.theory_angular_update.notna().any():
        smd = smd_equilibrium(runs, layers)
        if not smd.empty:
            out.append(_per_run(smd, "ratio", "smd_angular_ratio"))
            out.append(_per_run(smd, "norm_ratio", "smd_norm_ratio"))
        rate = smd_convergence(runs, layers)
        if not rate.empty:
            out += [_per_run(rate, "rate_ratio", "smd_rate_ratio"), _per_run(rate, "rate_r2", "smd_rate_r2"),
                    _per_run(rate, "fitted", "smd_rate_fitted"), _per_run(rate, "scale_drift", "smd_scale_drift"),
                    _per_run(rate, "span_probes", "smd_span_probes")]
    if not layers.empty and {"weight_norm", "scale_invariant"} <= set(layers.columns):
        out += _norm_growth(layers)
    if not layers.empty and {"grad_cosine", "scale_invariant"} <= set(layers.columns):
        out += _grad_cosines(layers)
    return out


def _grad_cosines(layers: pd.DataFrame) -> List[pd.DataFrame]:
    """Wan et al. 2021 Property 1, per run: the largest |cos(w, grad L(w))| over its
    scale-invariant weights and probe steps (0 by the property), and the median of the same over
    its other weights, which the property does not cover."""
    rows = layers.dropna(subset=["grad_cosine"])
    if rows.empty:
        return []
    flag, cos = is_scale_invariant(rows), rows.grad_cosine.abs()
    out = []
    if flag.any():
        out.append(cos[flag].groupby(rows.run[flag]).max().rename("value").reset_index()
                   .assign(measure="smd_grad_cosine_max"))
    if (~flag).any():
        out.append(cos[~flag].groupby(rows.run[~flag]).median().rename("value").reset_index()
                   .assign(measure="smd_other_grad_cosine"))
    return out


def _norm_growth(layers: pd.DataFrame) -> List[pd.DataFrame]:
    """Wan et al. 2021 Corollary 1, per run: the smallest ratio, over its scale-invariant weights
    and consecutive probe steps, of a weight's norm to its norm at the probe step before."""
    rows = layers.dropna(subset=["weight_norm"])
    rows = rows[is_scale_invariant(rows)]
    if rows.empty:
        return []
    rows = rows.sort_values("step")
    ratio = rows.groupby(["run", "stack", "layer", "sublayer", "param"], dropna=False).weight_norm.transform(
        lambda w: w / w.shift(1))
    growth = rows.assign(ratio=ratio).dropna(subset=["ratio"]).groupby("run").ratio.min()
    return [growth.rename("value").reset_index().assign(measure="smd_norm_min_growth")]


def _fold(root: Path, runs: pd.DataFrame) -> List[pd.DataFrame]:
    """Admin folded into Post-LN (model/fold.py), per finished Admin encoder-decoder run that kept
    its final weights (train.save_model): the largest difference of the two models' logits on a
    fixed batch of random tokens, and whether the folded model keeps an input scale (1) or is a
    plain Post-LN (0)."""
    import torch

    from stabexp.export import load_run_model
    from stabexp.model.fold import admin_to_postln
    from stabexp.train.files import MODEL

    out = []
    for run in runs.itertuples():
        folder = root / run.run
        if run.group != "admin" or not (folder / MODEL).is_file() or run.task in ("lm",):
            continue
        try:
            model = load_run_model(folder)
        except ConfigError as err:  # a model.pt that is not stabexp's: said, and the run skipped
            log.warning("%s", err)
            continue
        folded = admin_to_postln(model).eval()
        vocab = model.config.vocab_size
        tokens = torch.randint(4, vocab, (4, 2, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            error = (folded(tokens[0], tokens[1]) - model(tokens[0], tokens[1])).abs().max().item()
        out += [{"run": run.run, "measure": "fold_logit_error", "value": error},
                {"run": run.run, "measure": "fold_input_scale", "value": float(folded.input_scale is not None)}]
    return [pd.DataFrame(out)] if out else []


def measures(tables) -> pd.DataFrame:
    """Long table (run, measure, value) of every measure the collected tables give."""
    runs = tables["runs"]
    parts = [_per_run(runs, column, column) for column in SUMMARY_MEASURES if column in runs]
    parts += _model_updates(tables["metrics"]) + _gradient_mean(tables["metrics"]) + _top_gradient(tables["layers"])
    if not tables["metrics"].empty:
        parts += _convergence(tables["metrics"], "run")
    parts += _at_init(tables["metrics"], tables["layers"])
    parts += _decoder_early(tables["layers"]) + _spread_over_sublayers(tables["layers"]) + _clinic(tables["layers"])
    parts += _vanishing(tables["layers"]) + _dependency(tables["dependency"])
    parts += _settling(tables["layers"]) + _lemma1(tables["attention_mixing"])
    parts += _late_probes(tables)
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=["run", "measure", "value"])
    frame = pd.concat(parts, ignore_index=True)
    return frame.assign(value=pd.to_numeric(frame.value, errors="coerce")).dropna(subset=["value"])


def from_run_folders(folder: Path) -> pd.DataFrame:
    """The finished runs under `folder` as records (RECORD_COLUMNS)."""
    tables = collect(folder)
    runs = tables["runs"]
    if runs.empty:
        return pd.DataFrame(columns=RECORD_COLUMNS)
    runs = runs[runs.status.isin(FINISHED)]
    if runs.empty:
        return pd.DataFrame(columns=RECORD_COLUMNS)
    root = folder.parent if (folder / "summary.json").is_file() else folder
    ids = runs.assign(recipe=runs.experiment.map(lambda e: RECIPE_OF.get(e, e) if isinstance(e, str) else ""),
                      setting=runs.overrides.map(setting) if "overrides" in runs else "",
                      date=runs.run.map(lambda r: datetime.date.fromtimestamp(
                          (root / r / "summary.json").stat().st_mtime).isoformat()))
    ids = ids[["run", *KEY, "task", "status", "date"]]
    found = measures(_only(tables, runs))
    folds = _fold(root, runs)
    if folds:
        found = pd.concat([found, *folds], ignore_index=True)
    long = found.merge(ids, on="run")
    return _typed(long[RECORD_COLUMNS])


def _only(tables: Tables, runs: pd.DataFrame) -> Tables:
    """The collected tables restricted to some runs."""
    keep = set(runs.run)
    return Tables({name: (frame[frame.run.isin(keep)] if "run" in frame else frame) for name, frame in tables.items()})


# --- recorded tables ----------------------------------------------------------------------

CELL_MEASURES = ("final_eval_loss", "final_eval_acc", "test_loss", "test_bleu", "steps_done", "diverged_at_step")


def from_cells(path: Path) -> pd.DataFrame:
    """A table of finished cells (cells.py's, or one of the same kind keyed by experiment) as
    records."""
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    for column, default in (("setting", ""), ("decoder_depth", np.nan), ("scale", "default"), ("task", np.nan),
                            ("date", "")):
        if column not in frame:
            frame[column] = default
    frame["setting"] = frame.setting.astype(object).where(frame.setting.notna(), "").astype(str)
    curves = Path(path).with_name(Path(path).stem + "_curves.csv")
    if curves.is_file() and "recipe" in frame:  # the eval loss at init, what LR sensitivity is measured from
        steps = pd.read_csv(curves, keep_default_na=False, na_values=[""])
        steps["setting"] = steps.setting.astype(object).where(steps.setting.notna(), "").astype(str)
        init = steps[steps.step == 0].rename(columns={"eval_loss": "eval_loss@0"})
        join = ["recipe", "group", "depth", "seed", "setting"]
        frame = frame.merge(init[[*join, "eval_loss@0"]].drop_duplicates(join), on=join, how="left")
        for change in _convergence(steps, join):  # how far each curve moved over its last quarter
            frame = frame.merge(change.pivot_table(index=join, columns="measure", values="value").reset_index(),
                                on=join, how="left")
    if "experiment" in frame:  # the preset a run was made by says its recipe (RECIPE_OF)
        frame["recipe"] = frame.experiment.map(lambda e: RECIPE_OF.get(e, e) if isinstance(e, str) else "")
    present = [m for m in (*CELL_MEASURES, "eval_loss@0", *CONVERGENCE.values()) if m in frame]
    long = frame.melt(id_vars=[*KEY, "task", "status", "date"], value_vars=present, var_name="measure",
                      value_name="value").dropna(subset=["value"])
    return _typed(long[RECORD_COLUMNS])


def read_recorded(path: Path) -> pd.DataFrame:
    """A recorded table: `stabexp claims --record`'s (it has a `measure` column) or a cells table."""
    head = set(pd.read_csv(path, nrows=0).columns)
    needed = set(RECORD_COLUMNS) if "measure" in head else {"group", "depth", "seed", "status"}
    if not needed <= head or not ({"recipe", "experiment"} & head or "measure" in head):
        lacking = sorted(needed - head) or ["recipe"]
        raise ValueError(f"{path} is not a recorded table of runs: it has no column {lacking[0]!r} "
                         "(give one `stabexp claims --record` wrote, or a table of finished cells)")
    if "measure" not in head:
        return from_cells(path)
    return _typed(pd.read_csv(path, keep_default_na=False, na_values=[""]))


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for column in ("depth", "decoder_depth", "seed"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("Int64")
    # A decoder as deep as the encoder is the default: named only where it differs (admin_clinic's 1).
    frame["decoder_depth"] = frame.decoder_depth.mask(frame.decoder_depth == frame.depth)
    frame["setting"] = frame.setting.astype(object).where(frame.setting.notna(), "").astype(str).map(normal_setting)
    frame["setting"] = frame.setting.astype(object).where(frame.setting.notna(), "").astype(str)
    frame["scale"] = frame.scale.astype(object).where(frame.scale.notna(), "default").astype(str)
    frame["recipe"] = frame.recipe.astype(object).where(frame.recipe.notna(), "").astype(str)  # "": no preset
    frame["value"] = pd.to_numeric(frame.value, errors="coerce")
    return frame


def merge(sources: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """One record per run and measure; the first source holding it wins."""
    frames = [s for s in sources if not s.empty]
    if not frames:
        return pd.DataFrame(columns=RECORD_COLUMNS)
    merged = pd.concat(frames, ignore_index=True)
    key = run_keys(merged)
    return merged.loc[~pd.DataFrame({"k": key, "m": merged.measure}).duplicated()].reset_index(drop=True)


def run_keys(frame: pd.DataFrame) -> pd.Series:
    """One string per row naming its run (KEY), NA written as empty."""
    columns = [frame[c].astype(object).tolist() for c in KEY]
    return pd.Series(["|".join("" if pd.isna(v) else str(v) for v in row) for row in zip(*columns)], index=frame.index)


def write_recorded(path: Path, records: pd.DataFrame) -> pd.DataFrame:
    """Merge `records` into the recorded table at `path` (theirs win), sorted, atomically."""
    from stabexp.atomic import replacing

    old = read_recorded(path) if Path(path).is_file() else pd.DataFrame(columns=RECORD_COLUMNS)
    table = merge([records, old]).sort_values([*KEY, "measure"], na_position="first")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with replacing(Path(path)) as f:
        f.write(table[RECORD_COLUMNS].to_csv(index=False, float_format="%.6g").encode())
    return table


# --- one row per run, for the criteria ----------------------------------------------------

def wide(records: pd.DataFrame) -> pd.DataFrame:
    """One row per run: KEY, task, status, date, a column per measure, and `trained`."""
    if records.empty:
        return pd.DataFrame(columns=[*KEY, "task", "status", "date", "trained"])
    records = records.assign(setting=records.setting.astype(object).where(records.setting.notna(), "")
                             .astype(str).map(normal_setting))
    records = records.assign(_key=run_keys(records))
    ids = records.drop_duplicates("_key")[["_key", *KEY, "task", "status", "date"]]
    values = records.pivot_table(index="_key", columns="measure", values="value", aggfunc="first")
    frame = ids.merge(values, left_on="_key", right_index=True, how="left").drop(columns="_key")
    # A recorded cell without its task (an older table) ran its recipe's task.
    tasks = frame.dropna(subset=["task"]).groupby("recipe").task.first()
    frame["task"] = frame.task.fillna(frame.recipe.map(tasks))
    # A preset's runs at the paper's scale are a recipe of their own (NAME_paper); the quick scale
    # checks that a preset runs, it measures nothing a claim can rest on.
    frame = frame[frame.scale != "quick"].reset_index(drop=True)
    other = frame.scale != "default"
    frame.loc[other, "recipe"] = frame.recipe[other] + "_" + frame.scale[other]
    return with_outcome(frame)


def with_outcome(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `trained` (TRAINED_MARGIN, TRAINED_BLEU). A recorded cell without its reference loss
    takes the one its task's other runs recorded (it is a property of the data)."""
    frame = frame.copy()
    for column in ("unigram_eval_loss", "position_only_eval_loss", "final_eval_loss", "test_bleu"):
        if column not in frame:
            frame[column] = np.nan
    for column in ("unigram_eval_loss", "position_only_eval_loss"):
        by_task = frame.groupby("task")[column].median()
        frame[column] = frame[column].fillna(frame.task.map(by_task))
    diverged = frame.status == "diverged"
    translation = frame.task.isin(TRANSLATION_TASKS) | (frame.task.isna() & frame.test_bleu.notna())
    # A diverged run scores nothing: BLEU 0, and a final loss worse than any (its recorded one is
    # the last eval before it blew up, which a mean must not take for a result).
    frame.loc[diverged & translation, "test_bleu"] = 0.0
    frame.loc[diverged, "final_eval_loss"] = np.inf
    reference = pd.Series(np.where(frame.task == "lm", frame.unigram_eval_loss, frame.position_only_eval_loss),
                          index=frame.index, dtype=float)
    beats = (frame.final_eval_loss < reference - TRAINED_MARGIN).astype(float).where(reference.notna())
    trained = beats.where(~translation, (frame.test_bleu >= TRAINED_BLEU).astype(float).where(frame.test_bleu.notna()))
    frame["trained"] = trained.where(~diverged, 0.0)  # 1 trained, 0 not, NaN: no reference to tell
    return frame

