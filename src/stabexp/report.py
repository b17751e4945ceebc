"""`stabexp report [SWEEP_DIR]`: a markdown table of a sweep, one row per group, one column per
depth; a cell is the final eval loss and token accuracy (mean over seeds), on translation the
test BLEU and the final validation loss, or "diverged @ step k".
A sweep measured at init (train.steps=0, probe.at_init) shows the output change instead, and
below the table the fits of stabexp.analysis: Admin's output change against the number of
sublayers (linear and log, R^2 of each) and the log-log slope of the last W_2 gradient.

A folder is reported as found: a run that repeats another's config (two sweeps sharing a run)
counts once, a run whose summary says running that no process holds is interrupted, and what a
table leaves out (a run without metrics.csv, one without a measured update) is said under it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional, Tuple

import pandas as pd

from stabexp import paper
from stabexp.analysis import (
    clinic_fits,
    clinic_ratio,
    dependency_summary,
    depth_law,
    encoder_input_change,
    grid_counts,
    lr_sensitivity_table,
    run_setting,
    run_settings,
    last_w2_grad,
    output_change_fits,
    output_change_table,
    output_gradients,
    preln_stream_growth,
    smd_equilibrium,
    final_max_logit,
    layer_importance_table,
    stream_growth,
    setting_table,
    update_bound_steps,
    update_bound_table,
    vanishing_table,
    w2_grad_slopes,
)
from stabexp.paths import outputs_dir
from stabexp.plotting.collect import Tables, collect
from stabexp.plotting.figures import ordered_groups
from stabexp.train.files import current_status, read_summary

FINISHED = ("completed", "diverged")


def _cell(runs: pd.DataFrame) -> str:
    diverged = runs[runs.status == "diverged"]
    parts = []
    done = runs[runs.status == "completed"]
    if not done.empty:
        n = f", n={len(done)}" if len(done) > 1 else ""
        if _translation(done):
            spread = (f" [{done.test_bleu.min():.2f}-{done.test_bleu.max():.2f}]" if len(done) > 1 else "")
            parts.append(f"BLEU {done.test_bleu.mean():.2f}{spread} (loss {done.final_eval_loss.mean():.3f}{n})")
        elif done.final_eval_loss.isna().all():  # a monitor given no evaluate=
            parts.append(f"not evaluated{n}")
        else:
            parts.append(f"{done.final_eval_loss.mean():.3f} ({done.final_eval_acc.mean():.3f}{n})")
    parts += [_state(r) for r in diverged.itertuples()]
    other = runs[~runs.status.isin(["completed", "diverged"])]
    parts += [str(s) for s in other.status]
    return "; ".join(parts) or "-"


def _translation(runs: pd.DataFrame) -> bool:
    return "test_bleu" in runs and runs.test_bleu.notna().any()


def _change_cell(table: pd.DataFrame) -> str:
    if table.empty:
        return "-"
    n = f" (n={len(table)})" if len(table) > 1 else ""
    return f"{table.output_change.mean():.3g}{n}"


def _in_group_order(frame: pd.DataFrame, keys: List[str]) -> pd.DataFrame:
    """frame sorted by `keys`, where "rank" stands for the groups' figure order (ordered_groups)."""
    rank = {g: i for i, g in enumerate(ordered_groups(frame.group))}
    return frame.assign(rank=frame.group.map(rank)).sort_values(keys).drop(columns="rank")


def _markdown(frame: pd.DataFrame, formats: dict) -> List[str]:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(formats.get(c, "{}").format(row[c]) for c in frame.columns) + " |")
    return lines


def fits_section(tables) -> List[str]:
    """The output-change fits and the W_2 slopes, where the sweep measured them."""
    lines: List[str] = []
    if tables["metrics"].empty or tables["layers"].empty:
        return lines
    change = output_change_table(tables["metrics"], tables["layers"])
    fits = output_change_fits(change) if not change.empty else pd.DataFrame()
    if not fits.empty:
        lines += ["", "Output change against the number of sublayers N (Admin Theorem 2): "
                  "fits over every seed, c ~ a + b N and c ~ a + b ln N.", ""]
        lines += _markdown(fits[["group", "points", "sublayers", "change_at_min", "change_at_max",
                                 "linear_r2", "log_r2", "seed_linear_r2", "seed_log_r2"]],
                           {"change_at_min": "{:.3g}", "change_at_max": "{:.3g}",
                            "linear_r2": "{:.3f}", "log_r2": "{:.3f}"})
        means = change[change.sublayers == change.sublayers.max()].groupby("group").output_change.mean()
        if {"postln", "preln"} <= set(means.index):
            lines += ["", f"Post-LN / Pre-LN output change at {change.sublayers.max()} sublayers: "
                      f"{means['postln'] / means['preln']:.2f}"]
    lines += clinic_section(tables["layers"])
    runs = tables["runs"]
    smd = (smd_equilibrium(runs, tables["layers"])
           if "theory_angular_update" in runs and runs.theory_angular_update.notna().any() else pd.DataFrame())
    if not smd.empty:
        lines += ["", "Spherical motion dynamics: equilibrium angular update per step of the scale-invariant "
                  "weights (mean from window_from to the end) against the theory (stabexp/theory.py); "
                  "other_weights: the same mean for the weights that are not scale-invariant.", ""]
        lines += _markdown(smd[["optim", "lr", "weight_decay", "window_from", "predicted", "measured", "ratio",
                                "other_weights", "time_constant", "time_to_equilibrium", "norm_ratio"]],
                           {"lr": "{:g}", "weight_decay": "{:g}", "window_from": "{:.0f}", "predicted": "{:.4f}",
                            "measured": "{:.4f}", "ratio": "{:.3f}", "other_weights": "{:.4f}",
                            "time_constant": "{:.0f}", "time_to_equilibrium": "{:.0f}", "norm_ratio": "{:.3f}"})
    slopes = w2_grad_slopes(last_w2_grad(tables["layers"]))
    if not slopes.empty:
        lines += ["", "Last decoder W_2 gradient at init against depth L (Xiong et al. 2020): "
                  "log-log slope (0: flat, -0.5: 1/sqrt(L)).", ""]
        lines += _markdown(slopes, {"slope": "{:+.3f}", "r2": "{:.3f}", "seed_slope_sd": "{:.3f}",
                                    "seed_slope_min": "{:+.3f}", "seed_slope_max": "{:+.3f}"})
    vanishing = vanishing_table(output_gradients(tables["layers"]))
    if not vanishing.empty:
        vanishing = _in_group_order(vanishing, ["depth", "rank", "stack"])
        lines += ["", "Gradient of each sublayer's output at init relative to the largest in the network "
                  "(Admin Theorem 1; Transformer-Clinic's `--plot_gradient`), mean over runs: the stack's "
                  "bottom layer (bottom_range: min-max over runs), its top layer, its smallest sublayer, "
                  "and per kind of sublayer the factor the gradient keeps across one (input over output, "
                  "geometric mean; below 1: it shrinks going down).", ""]
        lines += _markdown(vanishing[["group", "depth", "stack", "runs", "bottom", "bottom_range", "top",
                                      "smallest", "kept_across"]],
                           {"bottom": "{:.3g}", "top": "{:.3g}", "smallest": "{:.3g}"})
    lines += dependency_section(tables.get("dependency", pd.DataFrame()))
    growth = preln_stream_growth(tables["layers"])
    if not growth.empty:
        lines += ["", "Pre-LN residual stream at init (Xiong et al. 2020): squared norm of each sublayer's "
                  "input against its position, linear fit.", ""]
        lines += _markdown(growth, {"first": "{:.1f}", "last": "{:.1f}", "slope": "{:.2f}", "r2": "{:.3f}"})
    return lines


def dependency_section(dependency: pd.DataFrame) -> List[str]:
    """Admin's residual dependency (probe.dependency), with the values read off Clinic's figures."""
    table = dependency_summary(dependency)
    if table.empty:
        return []
    rank = {g: i for i, g in enumerate(ordered_groups(table.group))}
    when = {"init": 0, "end": 1}
    table = table.assign(rank=table.group.map(rank), w=table.when.map(when)).sort_values(["depth", "stack", "w", "rank"])
    base = table.group.str.replace("_warmup", "", regex=False)
    table = table.assign(paper=[paper.ADMIN_DEPENDENCY_DIAGONAL.get((g, w), "-") for g, w in zip(base, table.when)])
    lines = ["", "Residual dependency (Admin Sec. 4.1; Transformer-Clinic's `--plot_variance`): beta_ii, the share "
             "of sublayer i's output that comes from its own branch, at i = 2, its mean over i >= 2 and at the last "
             "sublayer; the last sublayer's share from the embedding; mean of sum_j beta_ij^2 (1: orthogonal "
             "parts). paper: beta_ii read off Clinic's figures.", ""]
    lines += _markdown(table[["group", "depth", "stack", "when", "runs", "own_at_2", "own_mean", "own_at_last",
                              "embedding_at_last", "sum_sq", "paper"]],
                       {k: "{:.3f}" for k in ("own_at_2", "own_mean", "own_at_last", "embedding_at_last", "sum_sq")})
    return lines


def clinic_section(layers: pd.DataFrame) -> List[str]:
    """Admin Theorem 2 along the deepest encoder of each width (Transformer-Clinic's protocol),
    with the paper's fits beside ours."""
    curves = encoder_input_change(layers)
    fits = clinic_fits(curves) if not curves.empty else pd.DataFrame()
    if fits.empty:
        return []
    fits = _in_group_order(fits, ["model", "rank"])
    fits = fits.assign(paper=[", ".join(f"{k} {v}" for k, v in paper.ADMIN_FIT_R2.get(g, {}).items()) or "-"
                              for g in fits.group])
    lines = ["", "Change of each encoder sublayer's std-normalised input at init along the deepest encoder "
             "(Transformer-Clinic's protocol; per token, mean over runs, then fitted over i = 1..sublayers; "
             "seed_*: the same fits per run, min-max). paper: R^2 of the fits of Admin's Fig. 4.", ""]
    lines += _markdown(fits[["model", "group", "runs", "sublayers", "change_at_1", "change_at_last", "linear_r2",
                             "log_r2", "seed_linear_r2", "seed_log_r2", "paper"]],
                       {"change_at_1": "{:.3g}", "change_at_last": "{:.3g}", "linear_r2": "{:.3f}",
                        "log_r2": "{:.3f}"})
    ratio = clinic_ratio(curves)
    if not ratio.empty:
        lines += ["", f"Post-LN / Pre-LN at the last sublayer (paper: about {paper.ADMIN_POSTLN_OVER_PRELN:.0f} "
                  "at 200 sublayers):", ""]
        lines += _markdown(ratio, {"ratio": "{:.2f}"})
    return lines


def sweep_table(sweep_dir: Path) -> str:
    tables = collect(sweep_dir)
    if tables["runs"].empty:
        raise FileNotFoundError(f"no run folders (summary.json) under {sweep_dir}")
    root = sweep_dir.parent if (sweep_dir / "summary.json").is_file() else sweep_dir  # what run ids start from
    tables, counted_once = distinct_runs(with_current_status(tables, root), root)
    runs = tables["runs"]
    head = f"{sweep_dir}\n\n" + "".join(line + "\n" for line in [*counted_once, *without_metrics(runs, root)])
    at_init = bool((runs.steps_done.fillna(0) == 0).all()) and "output_change" in tables["metrics"]
    change = output_change_table(tables["metrics"], tables["layers"]) if at_init else None
    depths = sorted(runs.depth.unique())
    groups = ordered_groups(runs.group)
    if is_lr_sweep(runs):
        return head + "\n".join(lr_section(tables))
    single = runs.decoder_depth.isna().all()  # decoder-only / encoder-only: one stack of `depth` layers
    def label(d) -> str:  # the encoder's depth, then the decoder's its runs took (decoder_depth)
        if single:
            return f"{d}L"
        return f"{d}L-" + "/".join(f"{int(m)}L" for m in sorted(runs[runs.depth == d].decoder_depth.dropna().unique()))
    lines = ["| group | " + " | ".join(label(d) for d in depths) + " |",
             "|---|" + "---|" * len(depths)]
    # Runs of one group that ran different recipes (two sweeps of other train.steps into one
    # folder) are not averaged into one cell: a row per setting.
    settings = run_settings(runs)
    for g in groups:
        if at_init:
            cells = [_change_cell(change[(change.group == g) & (change.depth == d)]) for d in depths]
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
            continue
        mine = runs.group == g
        mixed = settings[mine].groupby(runs.depth[mine]).nunique().max() > 1
        for s in dict.fromkeys(settings[mine]) if mixed else [None]:
            kept = mine if s is None else mine & (settings == s)
            cells = [_cell(runs[kept & (runs.depth == d)]) for d in depths]
            lines.append(f"| {g if s is None else f'{g} ({s})'} | " + " | ".join(cells) + " |")
    chance = runs.chance_loss.dropna()
    if at_init:
        note = "Cells: output change |F(x,W) - F(x,W+delta)|^2 at init, mean over seeds."
    elif _translation(runs):
        note = ("Cells: test BLEU (sacreBLEU " + runs.bleu_signature.dropna().iloc[0] + ") and final "
                f"validation loss, after {int(runs.steps_done.max())} updates. Chance loss {chance.iloc[0]:.3f}.")
    else:
        note = f"Cells: final eval loss (token accuracy). Chance loss {chance.iloc[0]:.3f}." if len(chance) else ""
        unigram = runs.unigram_eval_loss.dropna()
        if len(unigram):  # task=lm: the loss of the training stream's token frequencies
            note += f" Unigram loss {unigram.iloc[0]:.3f}."
        for rule, name in (("source_counts", "source counts at every position"),
                           ("position_only", "each position's symbol frequencies")):
            if runs.get(f"{rule}_eval_loss", pd.Series(dtype=float)).notna().any():
                first = runs.dropna(subset=[f"{rule}_eval_loss"]).iloc[0]
                note += (f" Rule \"{name}\": {first[f'{rule}_eval_loss']:.3f}"
                         f" ({first[f'{rule}_eval_acc']:.3f}).")
    if not at_init and runs[runs.status == "completed"].final_eval_loss.isna().any():
        note += (" Not evaluated: a run with no eval loss (a folder of stabexp.monitor measures one when its "
                 "Monitor is given evaluate=, docs/probes.md).")
    text = head + "\n".join(lines) + ("\n\n" + note.strip() if note.strip() else "")
    extra = [] if at_init else depth_law_section(runs) + cost_section(runs)
    return text + "\n".join(["", *fits_section(tables), *settings_section(runs), *extra,
                             *update_bound_section(tables), *layer_importance_section(tables)])


def with_current_status(tables: Tables, root: Path) -> Tables:
    """The runs whose summary says "running" as they stand: "interrupted" where no process holds
    the folder any more (stabexp.status)."""
    runs = tables["runs"]
    if not (runs.status == "running").any():
        return tables
    status = [current_status(root / run, s) if s == "running" else s for run, s in zip(runs.run, runs.status)]
    return Tables(tables, runs=runs.assign(status=status))


def distinct_runs(tables: Tables, root: Path) -> Tuple[Tables, List[str]]:
    """The tables with every config once, and the lines saying which runs were left out for
    that: a run whose config another run under `root` also ran (a sweep folder copied, two
    sweeps sharing a setting, a sweep run again into a new folder) is counted once, as its
    finished copy, else the one furthest along, else the first by name."""
    runs = tables["runs"]
    keyed = runs.assign(config=[config_key(root / run) for run in runs.run],
                        unfinished=~runs.status.isin(FINISHED), steps=runs.steps_done.fillna(-1))
    keyed = keyed.sort_values(["unfinished", "steps", "run"], ascending=[True, False, True])
    repeats = keyed[keyed.duplicated("config")]
    if repeats.empty:
        return tables, []
    shown = keyed.drop_duplicates("config").set_index("config").run
    left_out = set(repeats.run)
    kept = Tables({name: frame[~frame.run.isin(left_out)].reset_index(drop=True) if "run" in frame else frame
                   for name, frame in tables.items()})
    return kept, ["Counted once (a run with the config of another run here is left out for it):",
                  *(f"- {r.run} (same config as {shown[r.config]}{_other_threads(root, r.run, shown[r.config])})"
                    for r in repeats.sort_values("run").itertuples()), ""]


def _other_threads(root: Path, run: str, kept: str) -> str:
    """Where two runs of one config ran at different torch thread counts, their numbers differ
    by rounding and from there on (docs/scale.md, "How many at once"): said, not hidden."""
    ran, kept_ran = ((read_summary(root / r) or {}).get("threads") for r in (run, kept))
    if ran is None or kept_ran is None or ran == kept_ran:
        return ""
    return (f"; it ran at {ran} thread(s), {kept} at {kept_ran}: the same config at other threads gives "
            f"other numbers, and the table shows {kept}'s")


def config_key(folder: Path) -> str:
    """What a run computes: the config fingerprint its summary records, else its config.yaml (a
    run of an older stabexp), else its folder (like no other)."""
    fingerprint = (read_summary(folder) or {}).get("config_fingerprint")
    if fingerprint:
        return f"fingerprint {fingerprint}"
    config = folder / "config.yaml"
    return config.read_text() if config.is_file() else f"folder {folder}"


def without_metrics(runs: pd.DataFrame, root: Path) -> List[str]:
    """The line naming the runs without a metrics.csv (their cells come from summary.json alone)."""
    missing = [run for run in runs.run if not _has_rows(root / run / "metrics.csv")]
    return [f"Without metrics.csv (only summary.json read): {', '.join(sorted(missing))}", ""] if missing else []


def _has_rows(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def _state(run) -> str:
    """A run's status as a cell says it."""
    if run.status == "diverged" and pd.notna(run.diverged_at_step):
        return f"diverged @ step {int(run.diverged_at_step)}"
    return str(run.status)


def settings_section(runs: pd.DataFrame) -> List[str]:
    """The runs of a cell that differ in one more override (DeepNet Fig. 7's one change at a
    time): final loss (test BLEU) per setting, and how far the settings spread."""
    table = setting_table(runs)
    if table.empty or table.groupby(["group", "depth"]).setting.nunique().max() < 2:
        return []
    translated = table.test_bleu.notna().any()
    settings = list(dict.fromkeys(table.setting))
    lines = ["", "Per setting (the overrides besides group, depth and seed): final validation loss"
             + (" (test BLEU)" if translated else "") + " over the completed runs, and the spread "
             "(largest minus smallest loss) over the settings.", "",
             "| group | depth | " + " | ".join(settings) + " | spread |", "|---|---|" + "---|" * (len(settings) + 1)]
    for (group, depth), rows in table.groupby(["group", "depth"], sort=False):
        by_setting = rows.set_index("setting")
        cells = []
        for name in settings:
            if name not in by_setting.index:
                cells.append("-")
                continue
            r = by_setting.loc[name]
            cells.append(f"{r.final_eval_loss:.3f}" + (f" ({r.test_bleu:.2f})" if translated else ""))
        lines.append(f"| {group} | {int(depth)} | " + " | ".join(cells) + f" | {rows.spread.iloc[0]:.3f} |")
    return lines


def depth_law_section(runs: pd.DataFrame) -> List[str]:
    """DeepNet Fig. 8's law, value = A ln(depth) + B, for sweeps of three depths or more."""
    if runs.depth.nunique() < 3:
        return []
    value = "test_bleu" if _translation(runs) else "final_eval_loss"
    law = depth_law(runs, value)
    if law.empty:
        return []
    return ["", f"Depth law (DeepNet Fig. 8 fits BLEU = A log(depth) + B): {value} = A ln(depth) + B per group "
            "over its completed depths (mean over seeds), R^2, and the depth of its best value.", "",
            *_markdown(law, {"A": "{:+.4f}", "B": "{:.4f}", "r2": "{:.3f}", "best": "{:.4f}"})]


def cost_section(runs: pd.DataFrame) -> List[str]:
    """What each cell cost: seconds per step (training, probes and evals included) and peak memory."""
    if "peak_memory_mib" not in runs or runs.peak_memory_mib.isna().all():
        return []
    cost = runs.dropna(subset=["peak_memory_mib"]).groupby(["group", "depth"], sort=False).agg(
        runs=("run", "count"), s_per_step=("steps_per_second", lambda v: (1 / v).mean()),
        wall_min=("wall_seconds", lambda v: v.mean() / 60), peak_mib=("peak_memory_mib", "mean")).reset_index()
    cost = _in_group_order(cost, ["rank", "depth"])
    return ["", "Cost per cell (mean over its runs): seconds per step over the whole run (probes and evals "
            "included), wall minutes, peak memory (CUDA allocator; on the CPU the process's peak RSS).", "",
            *_markdown(cost, {"s_per_step": "{:.3f}", "wall_min": "{:.1f}", "peak_mib": "{:.0f}"})]


def update_bound_section(tables) -> List[str]:
    """DeepNet Theorem 4.1's (4.3's on an encoder-decoder) bound against the measured model
    update (probe.update_bound)."""
    bound = tables.get("update_bound", pd.DataFrame())
    if bound.empty:
        return []
    steps = update_bound_steps(tables["metrics"], bound, tables["runs"])
    table = _in_group_order(update_bound_table(steps), ["rank", "depth"])
    runs = tables["runs"]
    unmeasured = runs[runs.run.isin(set(bound.run) - set(steps.run))]
    left_out = [f"{r.run} ({_state(r)}" + ("" if pd.notna(r.features_init_norm) else
                                          ", no ||F(x, theta_0)|| in its summary yet") + ")"
                for r in unmeasured.sort_values("run").itertuples()]
    said = ["", "Left out of the bound (no finite model update measured after step 0): " + "; ".join(left_out)]
    if table.empty:
        return said
    return ["", "DeepNet Theorem 4.1: the bound sum_i sqrt(v_i^2 + w_i^2) / alpha ||theta_i - theta_i,0|| "
            "(operator norms; on an encoder-decoder Theorem 4.3's, the encoder's sum carried by the "
            "cross-attentions' v w / alpha_d plus the decoder's terms; probes/update_bound.py) against the measured model update relative to "
            "||F(x, theta_0)||, at steps 1, 10 and 100 (mean over seeds); over every probe step the smallest "
            "and the median bound / measured (the bound holds where min_ratio >= 1), and the smallest in the "
            "Xavier-gain reading (min_ratio_gain).", "",
            *_markdown(table, {c: "{:.3g}" for c in table.columns if c not in ("group", "depth", "runs")}),
            *(said if left_out else [])]


def layer_importance_section(tables) -> List[str]:
    """The loss of skipping each layer (probe.layer_importance) and the residual stream's growth
    along the stack (stream_norm), per group and depth."""
    importance = tables.get("layer_importance", pd.DataFrame())
    if importance.empty:
        return []
    table = _in_group_order(layer_importance_table(importance), ["rank", "depth"])
    growth = _in_group_order(stream_growth(tables["layers"]), ["rank", "depth"])
    return ["", "Layer importance (\"The Curse of Depth\", Mix-LN): the eval-loss increase of skipping one layer "
            "(its output replaced by its input) at the last step, mean over the layers of the bottom and of "
            "the top half of the stack, the largest, and the share of layers whose skip costs under 0.01 nats "
            "(mean over seeds).", "",
            *_markdown(table, {c: "{:.4f}" for c in ("bottom_half", "top_half", "largest")} | {"cheap_share": "{:.2f}"}),
            "", "Residual stream norm per token (stream_norm) entering the first and the last sublayer at the "
            "last probe step, and last / first (Peri-LN's claim: bounded, where Pre-LN's grows).", "",
            *_markdown(growth, {"first": "{:.2f}", "last": "{:.2f}", "growth": "{:.2f}"})]


def is_lr_sweep(runs: pd.DataFrame) -> bool:
    """A sweep over the learning rate: some setting (the runs' overrides but train.lr) ran at
    two learning rates or more."""
    settings = runs.apply(run_setting, axis=1)
    return bool(runs.assign(setting=settings).groupby("setting").lr.nunique().max() >= 2)


def lr_section(tables) -> List[str]:
    """An lr sweep: final eval loss per setting and lr, and each setting's LR sensitivity
    (stabexp.analysis.lr_sensitivity)."""
    table = lr_sensitivity_table(tables["runs"], tables["metrics"])
    lrs = sorted(table.lr.unique())
    lines = ["| setting | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | LR sensitivity |",
             "|---|" + "---|" * (len(lrs) + 1)]
    for setting, rows in table.groupby("setting", sort=False):
        by_lr = rows.set_index("lr")
        cells = []
        for lr in lrs:
            if lr not in by_lr.index:
                cells.append("-")
            else:
                r = by_lr.loc[lr]
                cells.append(f"{r.final_eval_loss:.3f}" if r.status == "completed" else str(r.status))
        lines.append(f"| {setting} | " + " | ".join(cells) + f" | {rows.lr_sensitivity.iloc[0]:.3f} |")
    runs = tables["runs"]
    if runs.group.nunique() > 1 and (runs.group == "preln").any():
        lines += ["", "Per group and decade of lr: cells that diverged (loss above the run's limit) or completed; "
                  "below_preln: completed cells whose final eval loss is below Pre-LN's at the same setting, "
                  "of those where both completed.", ""]
        lines += _markdown(grid_counts(runs), {})
    logits = final_max_logit(tables["layers"])
    if len(logits):
        lines += ["", "Largest attention logit over the layers at the last probe step, per setting and lr "
                  "(Wortsman et al. 2023's attention logit growth; with train.qk_clip_tau the clip's ceiling).", ""]
        cell = table.assign(logit=table.run.map(logits)).pivot_table(index="setting", columns="lr", values="logit",
                                                                   sort=False)
        lines += ["| setting | " + " | ".join(f"lr {lr:g}" for lr in cell.columns) + " |",
                  "|---|" + "---|" * len(cell.columns)]
        lines += [f"| {setting} | " + " | ".join("-" if pd.isna(v) else f"{v:.1f}" for v in row) + " |"
                  for setting, row in cell.iterrows()]
    loss_0 = table.loss_0.dropna()
    lines += ["", "Cells: final eval loss. LR sensitivity: E_eta[min(loss(eta), loss_0) - loss*] over the lr "
              "grid (Wortsman et al. 2023), loss_0 the eval loss at init"
              + (f" ({loss_0.mean():.3f})" if len(loss_0) else "") + ", loss* the best final loss of the "
              "setting; a diverged run counts as loss_0."]
    return lines


def latest_sweep() -> Optional[Path]:
    sweeps = [p for p in (outputs_dir() / "multirun").glob("*") if p.is_dir()]
    return max(sweeps, key=lambda p: p.stat().st_mtime) if sweeps else None


def sweep_folder(argv: List[str], command: str, usage_note: str = "", made_by: str = "stabexp run -m"):
    """The one optional SWEEP_DIR argument of `stabexp report` / `stabexp status`: the folder,
    or the exit code after printing usage (-h) or a one-line error."""
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(f"usage: stabexp {command} [SWEEP_DIR]   (default: the newest folder under "
              f"{outputs_dir() / 'multirun'}{usage_note})", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    folder = Path(argv[0]) if argv else latest_sweep()
    if folder is None or not folder.is_dir():
        print(f"stabexp: error: no sweep folder {argv[0] if argv else 'under ' + str(outputs_dir() / 'multirun')}: "
              f"pass a folder made by `{made_by}`", file=sys.stderr)
        return 2
    return folder


def main(argv: List[str]) -> int:
    sweep = sweep_folder(argv, "report")
    if isinstance(sweep, int):
        return sweep
    try:
        print(sweep_table(sweep))
    except FileNotFoundError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    return 0
