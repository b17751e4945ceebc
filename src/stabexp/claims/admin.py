"""Admin's claims (Liu et al. 2020, arXiv 2004.08249, as its authors' Transformer-Clinic code
measures them) and Xiong et al. 2020's (arXiv 2002.04745), each with the criterion that judges it.
The criteria were written before the runs they read were looked at; a criterion changed since says
so in `revised`.
"""

from __future__ import annotations

import operator

from stabexp import paper
from stabexp.analysis import linear_and_log_fits
import stabexp.claims.regime as regime
from stabexp.claims.registry import (DOES_NOT_HOLD, HOLDS, NOT_SHOWN, PARTLY, Cells, Check, Claim, Evidence, compare, every,
                                     mean, over_seeds, past)
from stabexp.claims.rules import beats, grid, log_slope_per_seed, outcome, with_seeds

OUTPUT_CHANGE_DEPTHS = (6, 12, 18, 25, 50, 100)
SHAPE = {"postln": "linear", "preln": "log", "admin": "log"}


def _shape_fits(ev: Evidence, recipe: str, x: str, y: str, setting=""):
    """Per group: the fits (linear in x, linear in ln x) of y averaged over seeds at each x, and
    the same two fits of each seed alone."""
    out = {}
    for group in SHAPE:
        runs = ev.runs(recipe=recipe, group=group, setting=setting).dropna(subset=[x, y])
        curve = runs.groupby(x)[y].mean()
        averaged = linear_and_log_fits(curve.index, curve.values) if len(curve) >= 3 else None
        out[group] = (averaged, [linear_and_log_fits(r[x], r[y]) for _, r in runs.groupby("seed") if r[x].nunique() >= 3])
    return out


def _follows(fits, shape: str) -> bool:
    """The averaged curve's fit of `shape` has R² ≥ 0.95 and beats the other fit, and in every seed
    `shape` fits better than the other."""
    averaged, per_seed = fits
    other = "log" if shape == "linear" else "linear"
    return (averaged is not None and averaged[shape]["r2"] >= 0.95 and averaged[shape]["r2"] > averaged[other]["r2"]
            and every(f[shape]["r2"] > f[other]["r2"] for f in per_seed))


def _shape_verdict(fits):
    follows, parts = 0, []
    for group, shape in SHAPE.items():
        other = "log" if shape == "linear" else "linear"
        averaged, per_seed = fits[group]
        follows += _follows(fits[group], shape)
        wins = sum(f[shape]["r2"] > f[other]["r2"] for f in per_seed)
        r2 = f"{averaged[shape]['r2']:.3f} ({other} {averaged[other]['r2']:.3f})" if averaged else "-"
        parts.append(f"{group} {shape} R² {r2} over seeds, {shape} ahead in {wins} of {len(per_seed)} seeds")
    return (HOLDS if follows == 3 else PARTLY if follows else DOES_NOT_HOLD), "; ".join(parts)


def _theorem2(ev: Evidence):
    """Each group's output change at init, averaged over seeds at each depth, fitted against its
    number of sublayers, linear and in log (the paper fits one curve averaged over samples). A
    group follows its shape (linear for Post-LN, log for Pre-LN and Admin) when the averaged
    curve's fit of that shape has R² ≥ 0.95 and beats the other fit's, and in every seed that shape
    fits better than the other. Holds when all three groups follow their shape; partly when one or
    two do; otherwise it does not hold."""
    return _shape_verdict(_shape_fits(ev, "admin_output_change", "sublayers", "output_change"))


CLINIC_SUBLAYERS = 200  # one 100-layer encoder


def _clinic(ev: Evidence):
    """Along one 100-layer encoder at init (d = 512), each sublayer's input change against its index
    i, averaged over seeds at each i and fitted linear and log in i (Transformer-Clinic's one curve).
    A group follows its shape (linear for Post-LN, log for Pre-LN and Admin) when the averaged
    curve's fit of that shape has R² ≥ 0.95 and beats the other fit's, and in every seed that shape
    fits better than the other. Holds when all three groups follow their shape; partly when one or
    two do; otherwise it does not hold."""
    fits = {}
    for group in SHAPE:
        runs = ev.runs(recipe="admin_clinic", group=group, setting="model=base")
        points = [i for i in range(1, CLINIC_SUBLAYERS + 1) if f"clinic_input_change@{i}" in runs]
        curve = runs[[f"clinic_input_change@{i}" for i in points]].mean()
        averaged = linear_and_log_fits(points, curve.values) if len(points) >= 3 else None
        per_seed = [{"linear": {"r2": r.clinic_linear_r2}, "log": {"r2": r.clinic_log_r2}} for r in runs.itertuples()]
        fits[group] = (averaged, per_seed)
    return _shape_verdict(fits)


def _w2_slopes_per_seed(ev: Evidence):
    """Per group, the per-seed log-log slope of the last decoder FFN's W_2 gradient at init against depth."""
    return {g: log_slope_per_seed(ev.runs(recipe="grad_at_init", group=g), "depth", "w2_grad_last", log_y=True)
            .set_index("seed").slope for g in ("postln", "preln")}


def _w2_slopes(ev: Evidence):
    """Per seed, the log-log slope of the last decoder FFN's W_2 gradient at init against depth.
    Holds when the mean slope over seeds is within 0.15 of 0 for Post-LN and of −0.5 for Pre-LN and
    Pre-LN's slope is below Post-LN's in every seed; partly when only the order holds in every seed;
    otherwise it does not hold."""
    slopes = _w2_slopes_per_seed(ev)
    order = every(compare(slopes["preln"], slopes["postln"], operator.lt))
    near = abs(mean(slopes["postln"])) <= 0.15 and abs(mean(slopes["preln"]) + 0.5) <= 0.15
    measured = f"slope Post-LN {over_seeds(slopes['postln'], 2)}, Pre-LN {over_seeds(slopes['preln'], 2)}"
    return (HOLDS if order and near else PARTLY if order else DOES_NOT_HOLD), measured


W2_WINDOW = 0.15  # _w2_slopes' window around the paper's slopes


def _w2_resolved(ev: Evidence):
    slopes = _w2_slopes_per_seed(ev)
    error = {g: v.std(ddof=1) / len(v) ** 0.5 for g, v in slopes.items()}
    return (every(e <= W2_WINDOW / 2 for e in error.values()),
            ", ".join(f"{g} {error[g]:.3f} over {len(slopes[g])} seeds" for g in slopes))


W2_RESOLVED = Check(
    "resolved", f"the standard error of each group's mean slope over seeds is at most half the rule's {W2_WINDOW:g} window "
    "(the window is then two standard errors wide: a mean inside or outside it is the depth's, not the seeds' scatter)",
    _w2_resolved, guards=regime.EVERY_VERDICT,
    remedy="more seeds: stabexp run experiment=grad_at_init seed=8,9,10,11 (at init: about a minute a seed here, not timed)")


def _postln_stream_flat(ev: Evidence):
    r2 = ev.value("stream_sq_linear_r2", recipe="grad_at_init", group="postln", depth=100)
    return (None if r2.empty else every(r2 < 0.95)), f"Post-LN's R² {over_seeds(r2, 2)}"


STREAM_TELLS = Check(
    "the probe tells", "the same probe on the 100-layer Post-LN models at init, whose LayerNorm holds each x_l at norm √d, "
    "finds no rising line (R² below the rule's 0.95 in every seed): a probe or fit that found a line in any stream "
    "could not have failed", _postln_stream_flat, guards=(HOLDS,),
    remedy="stabexp run experiment=grad_at_init group=postln depth=100")


def _stream(ev: Evidence):
    """In the 100-layer Pre-LN models at init, E‖x_l‖² against the sublayer position l, a line per
    run (the worse of its two stacks, by R²; the smaller slope). Holds when the line rises with
    R² ≥ 0.95 in every seed; partly when it rises with R² ≥ 0.8 in every seed; otherwise it does not
    hold."""
    r2 = ev.value("stream_sq_linear_r2", recipe="grad_at_init", group="preln", depth=100)
    rises = every(ev.value("stream_sq_slope", recipe="grad_at_init", group="preln", depth=100) > 0)
    measured = f"R² {over_seeds(r2)}" + ("" if rises else "; the line does not rise in every seed")
    return (HOLDS if rises and every(r2 >= 0.95) else PARTLY if rises and every(r2 >= 0.8) else DOES_NOT_HOLD), measured


def _vanishing(ev: Evidence):
    """At 18L-18L at init, the output gradient of each stack's bottom layer relative to the
    network's largest. Holds when, in every seed, Post-LN's decoder is below 0.05 while Post-LN's
    encoder and Pre-LN's decoder are at least 0.3, and the smallest factor kept across one
    Post-LN decoder sublayer is the encoder-attention's. Partly when the vanishing is in the
    Post-LN decoder only but the encoder-attention is not where it loses most; otherwise it does
    not hold."""
    at = dict(recipe="admin_grad_vanishing", depth=18)
    dec = ev.value("decoder_bottom_gradient", group="postln", **at)
    enc = ev.value("encoder_bottom_gradient", group="postln", **at)
    pre = ev.value("decoder_bottom_gradient", group="preln", **at)
    runs = ev.runs(group="postln", **at)
    keeps = runs[[c for c in ("decoder_keep_cross_attn", "decoder_keep_self_attn", "decoder_keep_ffn") if c in runs]]
    cross = every(keeps.idxmin(axis=1) == "decoder_keep_cross_attn")
    only = (past(dec, operator.lt, 0.05, "Post-LN decoder's") & past(enc, operator.ge, 0.3, "Post-LN encoder's")
            & past(pre, operator.ge, 0.3, "Pre-LN decoder's"))
    measured = (f"decoder layer 1: Post-LN {over_seeds(dec, 2)}, Pre-LN {over_seeds(pre, 2)}; Post-LN encoder {over_seeds(enc, 2)}; "
                f"kept across a cross-attention {over_seeds(runs.get('decoder_keep_cross_attn', []), 2)}")
    return (HOLDS if only and cross else PARTLY if only else DOES_NOT_HOLD), measured


def _hybrid(recipe, depth, measure, higher_is_better):
    def criterion(ev: Evidence):
        """The hybrid of a Post-LN encoder and a Pre-LN decoder at 18L. Holds when its decoder's
        bottom-layer gradient at init is at least 0.3 of the largest in every seed (no vanishing),
        the hybrid fails in every seed (it diverges, or ends no better than the input-blind rule or
        below 1 BLEU: measures.with_outcome) and Pre-LN trains in every seed; partly when it does not
        vanish, Pre-LN trains and the hybrid fails in some seeds but not all; otherwise it does not
        hold."""
        grad = ev.value("decoder_bottom_gradient", recipe="admin_grad_vanishing", group="hybrid_postln_preln", depth=18)
        alive = every(grad >= 0.3)
        hybrid = outcome(ev, recipe, "hybrid_postln_preln", depth)
        preln = outcome(ev, recipe, "preln", depth)
        h = ev.value(measure, recipe=recipe, group="hybrid_postln_preln", depth=depth)
        p = ev.value(measure, recipe=recipe, group="preln", depth=depth)
        measured = (f"hybrid {over_seeds(h)} ({hybrid}) against Pre-LN {over_seeds(p)} ({preln}); its decoder's bottom "
                    f"gradient at init {over_seeds(grad, 2)}")
        if alive and hybrid == "fails" and preln == "trains":
            return HOLDS, measured
        return (PARTLY if alive and hybrid == "mixed" and preln == "trains" else DOES_NOT_HOLD), measured
    return criterion


def _dependency(ev: Evidence):
    """The encoder's mean β_ii (each sublayer's dependency on its own branch) at 18L. Holds when, in
    every seed, Post-LN's at init is above Pre-LN's, Admin's at init is nearer Pre-LN's than
    Post-LN's, and Admin's rises from init to the end, toward Post-LN's (nearer Post-LN's end value
    than it started; Clinic's 18-layer figure: Admin's deep diagonal 0.15-0.2 at init, 0.3-0.4
    after training); partly when the first two hold; otherwise it does not hold."""
    at = dict(recipe="admin_dependency", depth=18)
    v = {(g, w): ev.value(f"own_dependency@{w}", group=g, **at) for g in ("postln_warmup", "preln", "admin")
         for w in ("init", "end")}
    post_above = every(compare(v[("postln_warmup", "init")], v[("preln", "init")], operator.gt))

    def nearer(when, near, far):
        admin = v[("admin", when)]
        return every(compare((admin - v[(near, when)]).abs(), (admin - v[(far, when)]).abs(), operator.lt))
    starts = nearer("init", "preln", "postln_warmup")
    admin_end, admin_init, post_end = v[("admin", "end")], v[("admin", "init")], v[("postln_warmup", "end")]
    ends = (every(compare(admin_end, admin_init, operator.gt))
            and every(compare((admin_end - post_end).abs(), (admin_init - post_end).abs(), operator.lt)))
    measured = "; ".join(f"{g} β_ii {over_seeds(v[(g, 'init')], 2)} → {over_seeds(v[(g, 'end')], 2)}"
                         for g in ("postln_warmup", "preln", "admin"))
    return (HOLDS if post_above and starts and ends else PARTLY if post_above and starts else DOES_NOT_HOLD), measured


def _dependency_pattern(ev: Evidence):
    """Along the encoder at init, at 18L: the change of β_ii from sublayer 2 to the top, read off a
    line fitted to β_ii against the sublayer (measures: own_dependency_change@init). Holds when, in
    every seed, Pre-LN's falls by at least 0.1 (each sublayer leans more on what came before: the
    paper's 0.45 → 0.3) and Post-LN's changes by at most half as much either way (flat); partly
    when Pre-LN's falls by more than Post-LN's changes either way in every seed; otherwise it does
    not hold. (Pre-LN's fall follows from its stream growing at init; Post-LN's flatness is the
    part that could fail.)"""
    at = dict(recipe="admin_dependency", depth=18)
    pre = ev.value("own_dependency_change@init", group="preln", **at)
    post = ev.value("own_dependency_change@init", group="postln_warmup", **at)
    falls = every(pre <= -0.1)
    flat = every(compare(post.abs(), pre.abs(), lambda a, b: a <= 0.5 * b))
    measured = f"β_ii from sublayer 2 to the top at init: Post-LN {over_seeds(post, 2)}, Pre-LN {over_seeds(pre, 2)}"
    further = every(compare(pre, post, lambda a, b: a < 0 and a < -abs(b)))
    return (HOLDS if falls and flat else PARTLY if further else DOES_NOT_HOLD), measured


def _dependency_trained(ev: Evidence):
    """After training, at 18L: the encoder's mean β_ii. Holds when, in every seed, Pre-LN's has
    risen from its value at init (the share of the residual shrinks) and stays below Post-LN's (Pre-LN
    still leans more on the residual); partly when it is below Post-LN's in every seed but has not
    risen; otherwise it does not hold."""
    at = dict(recipe="admin_dependency", depth=18)
    pre_init = ev.value("own_dependency@init", group="preln", **at)
    pre_end = ev.value("own_dependency@end", group="preln", **at)
    post_end = ev.value("own_dependency@end", group="postln_warmup", **at)
    shrinks = every(compare(pre_end, pre_init, operator.gt))
    below = every(compare(pre_end, post_end, operator.lt))
    measured = (f"β_ii after training: Pre-LN {over_seeds(pre_end, 2)} (at init {over_seeds(pre_init, 2)}), "
                f"Post-LN {over_seeds(post_end, 2)}")
    return (HOLDS if shrinks and below else PARTLY if below else DOES_NOT_HOLD), measured


def _adjacent(ev: Evidence):
    """At init, at 18L: how alike two adjacent sublayers' outputs are, as the cosine of their rows
    of β (measures: adjacent_similarity@init, the mean over the encoder; for parts that are near
    orthogonal and carried along in their direction it is the correlation of the two outputs, about
    √(1 − β²) of the later sublayer's own share: the paper's inference from the dependency, read as
    a similarity, not a separate measurement).
    Holds when, in every seed, Pre-LN's is at least 0.9 ("adding a layer is like widening") and
    above Post-LN's; partly when it is above Post-LN's in every seed; otherwise it does not hold."""
    at = dict(recipe="admin_dependency", depth=18)
    pre = ev.value("adjacent_similarity@init", group="preln", **at)
    post = ev.value("adjacent_similarity@init", group="postln_warmup", **at)
    above = every(compare(pre, post, operator.gt))
    measured = f"adjacent sublayers' similarity at init: Pre-LN {over_seeds(pre, 2)}, Post-LN {over_seeds(post, 2)}"
    return (HOLDS if above and every(pre >= 0.9) else PARTLY if above else DOES_NOT_HOLD), measured


ADAM_AT = dict(recipe="deepnet_early", group="postln", depth=18)


def _gradients_spread(ev: Evidence):
    grads = ev.value("grad_log_range@30", **ADAM_AT)
    return (None if grads.empty else every(grads >= 1)), f"log10 range of the gradients {over_seeds(grads, 2)}"


GRADIENTS_SPREAD = Check(
    "gradients spread", "the sublayers' gradients at update 30 spread by at least 10x (log10 range ≥ 1) in every seed: "
    "where they do not, Adam has nothing to even out", _gradients_spread, guards=regime.EVERY_VERDICT)


def _adam_balance(ev: Evidence):
    """In Post-LN at 18L-18L under Adam, at update 30: how far the sizes of the sublayers'
    gradients and of their relative updates spread, each as log10(largest / smallest) over every
    sublayer (measures: grad_log_range@30, update_log_range@30). Holds when the updates' range is at
    most half the gradients' in every seed (Adam evens them out); partly when it is smaller in every
    seed; otherwise it does not hold. The gradients spreading by at least 10x, without which there
    is nothing to even out, is the regime check "gradients spread"."""
    grads, updates = ev.value("grad_log_range@30", **ADAM_AT), ev.value("update_log_range@30", **ADAM_AT)
    measured = f"log10 range over sublayers at update 30: gradients {over_seeds(grads, 2)}, relative updates {over_seeds(updates, 2)}"
    half = every(compare(updates, grads, lambda u, g: u <= 0.5 * g))
    return (HOLDS if half else PARTLY if every(compare(updates, grads, operator.lt)) else DOES_NOT_HOLD), measured


BETAS = ["[0.9,0.99]", "[0.9,0.995]", "[0.9,0.999]"]
GRID_LRS = [f"{lr:.0e}".replace("e-0", "e-") for lr in paper.ADMIN_GRID_LRS]  # "1e-4", as the presets write them
GRID = grid(**{"optim.betas": BETAS, "train.lr": GRID_LRS})
# At the paper's scale the grid runs on translation (task=multi30k on the command line).
GRID_PAPER = grid(**{"optim.betas": BETAS, "task": ["multi30k"], "train.lr": GRID_LRS})


def _failed_settings(ev: Evidence, recipe: str, group: str, settings) -> set:
    """The settings in which most of the group's runs failed: diverged, or ended no better than the
    input-blind rule (measures.with_outcome), both of which Table 1 counts as a failure."""
    runs = ev.runs(recipe=recipe, group=group, depth=6, setting=settings)
    failed = runs.groupby("setting").trained.apply(lambda t: (t == 0).sum() > len(t) / 2)
    return set(failed[failed].index)


def _grid(recipe, settings):
    def criterion(ev: Evidence):
        """Over the paper's 15 (lr, β₂) settings without warm-up, a setting fails for a group when most
        of its seeds fail: diverge by the tool's rule (methods.md) or end no better than the
        input-blind rule. Holds when Post-LN fails in at least 5 (a third) while Pre-LN and Admin fail
        in none; partly otherwise when Post-LN fails in more settings than each of the other two; it
        does not hold when Post-LN fails in no more settings than Pre-LN or Admin."""
        counts = {g: len(_failed_settings(ev, recipe, g, settings)) for g in paper.ADMIN_GRID_DIVERGED}
        measured = ", ".join(f"{g} fails in {n} of 15" for g, n in counts.items())
        if counts["postln"] >= 5 and counts["preln"] == counts["admin"] == 0:
            return HOLDS, measured
        more = counts["postln"] > max(counts["preln"], counts["admin"])
        return (PARTLY if more else DOES_NOT_HOLD), measured
    return criterion


def _grid_beats(recipe, settings):
    def criterion(ev: Evidence):
        """Over the paper's 15 settings, those where Post-LN does not fail (`_grid`'s reading): in how
        many Post-LN beats Pre-LN on the final eval loss (rules.beats: paired by seed, lower in a
        majority of seeds and on the mean by more than the noise of the difference). Not shown when
        Post-LN fails in every setting. Holds when it beats Pre-LN in at least 7/8 of them (the
        paper's 7 of 8); partly when in more than half; otherwise it does not hold."""
        failed = _failed_settings(ev, recipe, "postln", settings)
        kept = [s for s in settings if s not in failed]
        wins = sum(beats(ev.value("final_eval_loss", recipe=recipe, group="postln", depth=6, setting=s),
                         ev.value("final_eval_loss", recipe=recipe, group="preln", depth=6, setting=s), False)
                   for s in kept)
        measured = f"Post-LN converges in {len(kept)} of 15 and beats Pre-LN in {wins} of them"
        if not kept:
            return NOT_SHOWN, measured
        return (HOLDS if wins >= 7 / 8 * len(kept) else PARTLY if wins > len(kept) / 2 else DOES_NOT_HOLD), measured
    return criterion


REZEROS = ("rezero", "rezero_postln")


# "The other models" of Transformer-Clinic's ReZero comment (iwslt14_de-en.md): the 6L-6L
# Post-LN, Pre-LN and Admin of the same recipe file, each with its warm-up.
CLINIC_MODELS = ("postln_warmup", "preln", "admin")  # Clinic's Post-LN warms up over 6000 updates


def _rezero(ev: Evidence):
    """Test BLEU at 6L on translation (the multi30k_table recipe, which admin_rezero's runs share).
    The models compared are "the other models" of Transformer-Clinic's comment, its 6L-6L Post-LN
    (with the recipe's warm-up), Pre-LN and Admin, those run with three seeds. Holds when each ReZero is
    beaten by every one of them (rules.beats: paired by seed, higher in a majority of seeds and on
    the mean by more than the noise of the difference) and its mean is within 3 BLEU of the best
    of them ("1-2 BLEU below"); partly when each is beaten by every one of them but further below;
    otherwise, when a ReZero is not beaten by one of them, it does not hold. The other groups run
    there (DeepNorm, Fixup, T-Fixup, ...) are reported and not compared: the comment does not
    name them."""
    # admin_rezero's runs are multi30k_table's recipe
    runs = with_seeds(ev.runs(recipe="multi30k_table", depth=6), "test_bleu", keep=REZEROS)
    means = runs.groupby("group").test_bleu.mean()
    others = [g for g in means.index if g in CLINIC_MODELS]
    bleu = {g: ev.value("test_bleu", recipe="multi30k_table", group=g, depth=6) for g in means.index}
    below = bool(others) and all(beats(bleu[o], bleu[r], True) for r in REZEROS for o in others)
    near = bool(others) and means[others].max() - means[list(REZEROS)].min() <= 3
    measured = ", ".join(f"{g} {over_seeds(bleu[g])}" for g in means.index if g in (*others, *REZEROS))
    rest = [g for g in means.index if g not in (*others, *REZEROS)]
    if rest:
        measured += "; not compared: " + ", ".join(f"{g} {mean(bleu[g]):.3g}" for g in rest)
    return (HOLDS if below and near else PARTLY if below else DOES_NOT_HOLD), measured


def _admin_depths(ev: Evidence):
    """Test BLEU at 6L, 12L and 18L on translation, paired by seed (a diverged run counts 0).
    Holds when, at every depth, Admin trains in every seed and beats both Post-LN and Pre-LN
    (rules.beats: better in a majority of seeds and on the mean by more than the noise of the
    difference; the paper's claim: Admin beats both); partly when Admin trains and beats Post-LN at
    every depth but not Pre-LN somewhere; it does not hold when Admin fails at a depth or does not
    beat Post-LN there."""
    parts, beats_post, beats_pre, trains = [], 0, 0, True
    for d in (6, 12, 18):  # a diverged run's BLEU counts as 0 (measures.with_outcome)
        b = {g: ev.value("test_bleu", recipe="multi30k_table", group=g, depth=d) for g in ("admin", "preln", "postln")}
        beats_post += beats(b["admin"], b["postln"], higher_is_better=True)
        beats_pre += beats(b["admin"], b["preln"], higher_is_better=True)
        trains &= outcome(ev, "multi30k_table", "admin", d) == "trains"
        parts.append(f"{d}L Admin {mean(b['admin']):.2f}, Pre-LN {mean(b['preln']):.2f}, Post-LN {mean(b['postln']):.2f}")
    measured = "; ".join(parts) + f" (means); Admin beats Post-LN at {beats_post} of 3 depths, Pre-LN at {beats_pre} of 3"
    if not trains or beats_post < 3:
        return DOES_NOT_HOLD, measured
    return (HOLDS if beats_pre == 3 else PARTLY), measured


def _postln_deeper(ev: Evidence):
    """Admin's Table 2: Post-LN diverges at 12 and 18 layers (here on the translation recipe). Holds
    when Post-LN diverges (the tool's rule, methods.md) at 12L and at 18L in every seed; partly
    when at both depths it fails in every seed (diverges, or ends below 1 BLEU:
    measures.with_outcome) but some run fails without diverging, the sentence's "diverges" not
    met; otherwise it does not hold."""
    parts, failing, diverging = [], 0, 0
    for d in (12, 18):
        runs = ev.runs(recipe="multi30k_table", group="postln", depth=d)
        found = outcome(ev, "multi30k_table", "postln", d)
        failing += found == "fails"
        diverging += bool(len(runs)) and bool((runs.status == "diverged").all())
        parts.append(f"{d}L {found} (BLEU {over_seeds(runs.test_bleu, 2)}; {int((runs.status == 'diverged').sum())} of "
                     f"{len(runs)} diverged)")
    measured = "Post-LN " + "; ".join(parts)
    return (HOLDS if diverging == 2 else PARTLY if failing == 2 else DOES_NOT_HOLD), measured


# The gap below the paper's BLEU that the deep En-Fr claim still counts as reached: stabexp scores
# detokenised sacreBLEU on the last weights, the paper tokenised BLEU on the average of the last
# ten epochs' checkpoints with length penalty 0.8 (conf/experiment/admin_60l_12l.yaml).
EN_FR_MARGIN = 1.0


def _deep_en_fr(ev: Evidence):
    """Test BLEU of Admin's 60L-12L model on WMT'14 En-Fr, Transformer-Clinic's recipe at the
    paper's scale. Holds when Admin trains in every seed (no divergence, no stall: measures.with_outcome)
    and its mean test BLEU is at least the paper's 43.8 less EN_FR_MARGIN (1 BLEU, for the scoring's
    differences from the paper's); partly when it trains in every seed with a lower mean; it does
    not hold when a seed diverges or stalls."""
    bleu = ev.value("test_bleu", recipe="admin_60l_12l_paper", group="admin", depth=60)
    trains = outcome(ev, "admin_60l_12l_paper", "admin", 60) == "trains"
    measured = f"Admin {over_seeds(bleu)} (paper {paper.ADMIN_60L_12L_EN_FR_BLEU})"
    if not trains:
        return DOES_NOT_HOLD, measured
    return (HOLDS if mean(bleu) >= paper.ADMIN_60L_12L_EN_FR_BLEU - EN_FR_MARGIN else PARTLY), measured


def _fold(ev: Evidence):
    """The largest difference of logits between a trained Admin model and its fold into Post-LN,
    per seed, and whether the fold keeps a per-dimension input scale. Holds when every difference
    is at most 1e-4 and no fold keeps an input scale (a plain Post-LN); partly when every difference
    is at most 1e-4 but an input scale stays; otherwise it does not hold."""
    runs = ev.runs(recipe="", group="admin", depth=6, setting="train.save_model=true")
    error, scale = runs.fold_logit_error, runs.fold_input_scale
    equal = every(error <= 1e-4)
    measured = f"largest logit difference {error.max():.1e}; an input scale kept in {int(scale.sum())} of {len(scale)}"
    return (HOLDS if equal and not scale.any() else PARTLY if equal else DOES_NOT_HOLD), measured


ADMIN_TINY = "tiny 64-128-2 model, sort task"
MULTI30K = "tiny model, Multi30k De-En, 1000 updates of ≤ 2048 tokens"

CLAIMS = [
    Claim(id="admin-thm2", source="Admin Theorem 2 / Fig. 4",
          statement="Under a small perturbation at init the output change grows linearly with depth for Post-LN, like its log for Pre-LN and Admin",
          paper="R² 0.991 / 0.987 / 0.995", evidence=ADMIN_TINY + ", 6L-100L at init (across models)",
          command="stabexp run experiment=admin_output_change",
          needs=(Cells("admin_output_change", tuple(SHAPE), OUTPUT_CHANGE_DEPTHS, measures=("output_change", "sublayers")),), criterion=_theorem2,
          section="6-output-change-along-the-encoder-admin-theorem-2-fig-4",
          revised="2026-12-04: R² ≥ 0.95 in every seed asked more than the paper, which fits one curve averaged over samples; the averaged curve is fitted, and each seed must favour the paper's shape (does not hold at this scale → does not hold at this scale).",
          checks=(regime.not_this_quantity("the theorem's F is the output of the Post-LN or Pre-LN stack it perturbs (Transformer-Clinic measures it along one encoder)", "these runs measure F at the top of the decoder, through every cross-attention: admin-thm2-clinic measures the encoder"),)),
    Claim(id="admin-thm2-clinic", source="Admin Theorem 2 / Fig. 4, Transformer-Clinic's protocol",
          statement="The same along one 100-layer encoder (200 sublayers) at d = 512",
          paper="R² 0.991 / 0.987 / 0.995; Post-LN / Pre-LN 13 at 200 sublayers", evidence="one 100-layer encoder, d = 512, Multi30k batch, at init",
          command="stabexp run experiment=admin_clinic model=base seed=0,1,2",
          needs=(Cells("admin_clinic", tuple(SHAPE), (100,), settings=("model=base",), measures=("clinic_linear_r2", "clinic_log_r2")),), criterion=_clinic,
          section="6-output-change-along-the-encoder-admin-theorem-2-fig-4",
          revised="2026-12-04, before its runs: as admin-thm2, the curve averaged over seeds is fitted and each seed must favour the paper's shape (not run → not run).",
          unchecked="at init, along one stack: the theorem's own quantity and setting (no training regime enters), each seed "
                    "must favour the shape the averaged curve has, and the three groups' shapes are each other's controls"),
    Claim(id="xiong-w2-grad", source="Xiong et al. 2020",
          statement="At init the last W_2's gradient is flat in depth for Post-LN and shrinks like L^−½ for Pre-LN",
          paper="log-log slope 0 / −0.5", evidence=ADMIN_TINY + ", 6L-100L at init",
          command="stabexp run experiment=grad_at_init",
          needs=(Cells("grad_at_init", ("postln", "preln"), OUTPUT_CHANGE_DEPTHS, measures=("w2_grad_last",)),), criterion=_w2_slopes,
          section="7-last-layer-gradient-at-init-against-depth-xiong-et-al-2020", checks=(W2_RESOLVED,)),
    Claim(id="xiong-preln-stream", source="Xiong et al. 2020",
          statement="Pre-LN's E‖x_l‖² grows linearly in l",
          paper="linear", evidence=ADMIN_TINY + ", 100L-100L at init",
          command="stabexp run experiment=grad_at_init",
          needs=(Cells("grad_at_init", ("preln",), (100,), measures=("stream_sq_linear_r2", "stream_sq_slope")),), criterion=_stream,
          section="8-pre-lns-residual-stream-grows-linearly-xiong-et-al-2020",
          revised="2026-12-03, after the runs were read: a line must also rise (its slope > 0), which the claim says and the first rule did not check (the verdict did not change).",
          checks=(STREAM_TELLS,)),
    Claim(id="admin-thm1", source="Admin Theorem 1",
          statement="At init the gradient vanishes in the Post-LN decoder only, most at the encoder-attention",
          paper="shape only", evidence=ADMIN_TINY + ", 18L-18L at init",
          command="stabexp run experiment=admin_grad_vanishing",
          needs=(Cells("admin_grad_vanishing", ("postln", "preln"), (18,), measures=("decoder_bottom_gradient", "encoder_bottom_gradient")),
           Cells("admin_grad_vanishing", ("postln",), (18,), measures=("decoder_keep_cross_attn",))), criterion=_vanishing,
          section="14-gradient-vanishing-is-in-the-post-ln-decoder-only-admin-theorem-1",
          unchecked="at init (no training regime enters); the rule holds its controls: the same probe must read Post-LN's "
                    "encoder and Pre-LN's decoder as kept (at least 0.3) where it reads Post-LN's decoder as vanished"),
    Claim(id="admin-hybrid", source="Admin's hybrid table",
          statement="A Pre-LN decoder on a Post-LN encoder does not vanish and still fails at 18L",
          paper="fails at 18L", evidence=ADMIN_TINY + ", 18L-18L, 300 steps",
          command="stabexp run experiment=admin_hybrid",
          needs=(Cells("admin_hybrid", ("hybrid_postln_preln", "preln"), (18,), measures=("final_eval_loss",)),
           Cells("admin_grad_vanishing", ("hybrid_postln_preln",), (18,), measures=("decoder_bottom_gradient",))),
          criterion=_hybrid("admin_hybrid", 18, "final_eval_loss", False),
          section="15-fixing-the-vanishing-does-not-fix-the-training-admins-hybrid-table",
          revised="2026-12-04: \"partly\" for a hybrid that trains to 5 times Pre-LN's loss read a failure into a run that trains; the paper's hybrid diverges, so partly now needs some of its seeds to fail (partly → does not hold at this scale).",
          checks=(regime.control("admin_hybrid", "postln_warmup", 18, "fails", "the failure the hybrid is to keep: where Post-LN trains at 18L, a hybrid that trains shows nothing of it", remedy="stabexp run experiment=admin_hybrid group=postln_warmup depth=18 (three runs: 4 min 6 s here on 2026-12-07, packed two at a time)"),)),
    Claim(id="admin-hybrid-multi30k", source="Admin's hybrid table",
          statement="The same on translation",
          paper="fails at 18L", evidence=MULTI30K + ", 18L-18L",
          command="stabexp run experiment=multi30k_table group=hybrid_postln_preln,preln depth=18 seed=0,1,2",
          needs=(Cells("multi30k_table", ("hybrid_postln_preln", "preln"), (18,), measures=("test_bleu",)),
           Cells("admin_grad_vanishing", ("hybrid_postln_preln",), (18,), measures=("decoder_bottom_gradient",))),
          criterion=_hybrid("multi30k_table", 18, "test_bleu", True),
          section="15-fixing-the-vanishing-does-not-fix-the-training-admins-hybrid-table",
          revised="2026-12-04: as admin-hybrid, partly needs some of the hybrid's seeds to fail (not run → not run).",
          cost="about 41 min here for the two seeds beyond the first (four 18L-18L Multi30k runs of 19-20 min, packed two at a time, 2026-12-05); one GPU: not measured, the GPU path has not run",
          checks=(regime.control("multi30k_table", "postln_warmup", 18, "fails", "the failure the hybrid is to keep"),)),
    Claim(id="admin-dependency", source="Admin Sec. 4.1",
          statement="Post-LN depends on its own branch, Pre-LN on all; Admin starts like Pre-LN and ends like Post-LN",
          paper="β_ii 0.45-0.6 / 0.45 → 0.3 at init", evidence=ADMIN_TINY + ", 18L-18L, 600 steps",
          command="stabexp run experiment=admin_dependency depth=18 seed=0,1,2",
          needs=(Cells("admin_dependency", ("postln_warmup", "preln", "admin"), (18,),
                 measures=("own_dependency@init", "own_dependency@end")),), criterion=_dependency,
          section="16-residual-dependency-admin-sec-41",
          revised="2026-12-05, after an independent review: \"ends like Post-LN\" asked Admin's final β_ii to be nearer Post-LN's than Pre-LN's, which the paper's own figures would fail (Admin 0.3-0.4 after training, Pre-LN 0.35-0.45, Post-LN 0.45-0.65); it now asks that Admin's rise from init toward Post-LN's, as in Clinic's 18-layer figure (partly → partly).",
          checks=(regime.control("admin_dependency", "postln_warmup", 18, "trains", "Admin's end is compared with a trained Post-LN's"),)),
    Claim(id="admin-dependency-pattern", source="Admin Sec. 4.1",
          statement="At init Post-LN's dependency on its own branch is about constant along the stack, while Pre-LN's falls with the layer",
          paper="β_ii 0.45-0.6 flat / 0.45 → 0.3 at init", evidence=ADMIN_TINY + ", 18L-18L at init",
          command="stabexp run experiment=admin_dependency depth=18 seed=0,1,2",
          needs=(Cells("admin_dependency", ("postln_warmup", "preln"), (18,), measures=("own_dependency_change@init",)),),
          criterion=_dependency_pattern, section="16-residual-dependency-admin-sec-41",
          unchecked="at init (no training regime enters); the part that could fail, Post-LN's flat β_ii beside Pre-LN's fall, "
                    "is the rule's own"),
    Claim(id="admin-dependency-trained", source="Admin Sec. 4.1",
          statement="After training Pre-LN's dependency on the residual shrinks, but stays larger than Post-LN's",
          paper="β_ii after training 0.35-0.45 / 0.45-0.65", evidence=ADMIN_TINY + ", 18L-18L, 600 steps",
          command="stabexp run experiment=admin_dependency depth=18 seed=0,1,2",
          needs=(Cells("admin_dependency", ("postln_warmup", "preln"), (18,), measures=("own_dependency@init", "own_dependency@end")),),
          criterion=_dependency_trained, section="16-residual-dependency-admin-sec-41",
          checks=(regime.control("admin_dependency", "postln_warmup", 18, "trains", "Pre-LN's end is compared with a trained Post-LN's"),)),
    Claim(id="admin-adjacent-layers", source="Admin Sec. 4.1",
          statement="In Pre-LN adjacent layers are hardly distinguishable: adding a layer is like widening the last one",
          paper="qualitative", evidence=ADMIN_TINY + ", 18L-18L at init",
          command="stabexp run experiment=admin_dependency depth=18 seed=0,1,2",
          needs=(Cells("admin_dependency", ("postln_warmup", "preln"), (18,), measures=("adjacent_similarity@init",)),),
          criterion=_adjacent, section="16-residual-dependency-admin-sec-41",
          unchecked="at init (no training regime enters); Post-LN's similarity, read by the same probe, is the rule's control"),
    Claim(id="admin-adam-balance", source="Admin Sec. 3",
          statement="Adam evens out the sizes of the layers' updates although their gradients differ widely",
          paper="qualitative", evidence=ADMIN_TINY.replace("sort task", "sort task, Adam") + ", Post-LN 18L-18L, update 30",
          command="stabexp run experiment=deepnet_early group=postln seed=0,1,2",
          needs=(Cells("deepnet_early", ("postln",), (18,), measures=("grad_log_range@30", "update_log_range@30")),),
          criterion=_adam_balance, section="3-gradient-per-decoder-layer-deepnet-fig-4-v1",
          revised="2026-12-07, after an independent review: the gradients' 10x spread, a branch of the rule, is now the regime "
                  "check \"gradients spread\", read and printed beside it (the same condition; holds → holds).",
          checks=(GRADIENTS_SPREAD,)),
    Claim(id="admin-grid", source="Admin's (lr, β₂) grid",
          statement="Without warm-up Post-LN diverges in 7 of 15 settings; Pre-LN and Admin in none",
          paper="7 / 0 / 0 of 15", evidence=ADMIN_TINY + ", 6L-6L, RAdam, 300 steps, three seeds per setting",
          command=f"stabexp run experiment=admin_grid seed=0,1,2 train.lr={','.join(GRID_LRS)}",
          needs=(Cells("admin_grid", tuple(paper.ADMIN_GRID_DIVERGED), (6,), settings=tuple(GRID)),), criterion=_grid("admin_grid", GRID),
          section="17-the-lr-beta2-grid-without-warm-up-admins-15-settings",
          revised="2026-12-03, before its runs: a setting counts once however many of its runs diverged. "
                  "2026-12-04, before its runs: a run that stalls at the input-blind rule fails as one that diverges (Table 1 counts both), a setting fails when most of its three seeds do (not run → not run).",
          cost="about 55 min here: 135 runs at the 24 s per run of admin_grid's cost line (90 runs in 36 min); one GPU: not measured, the GPU path has not run",
          checks=(regime.some_run_diverges("admin_grid", GRID, remedy="the grid at the paper's scale: claim admin-grid-paper, about 3 GPU-hours"),)),
    Claim(id="admin-grid-beats", source="Admin's (lr, β₂) grid",
          statement="Where Post-LN converges it beats Pre-LN in 7 of the 8 settings",
          paper="7 of 8", evidence=ADMIN_TINY + ", 6L-6L, RAdam, 300 steps, three seeds per setting",
          command=f"stabexp run experiment=admin_grid seed=0,1,2 train.lr={','.join(GRID_LRS)}",
          needs=(Cells("admin_grid", ("postln", "preln"), (6,), settings=tuple(GRID), measures=("final_eval_loss",)),),
          criterion=_grid_beats("admin_grid", GRID), section="17-the-lr-beta2-grid-without-warm-up-admins-15-settings",
          cost="about 55 min here, as admin-grid's; one GPU: not measured, the GPU path has not run",
          checks=(regime.converged("admin_grid", ("postln", "preln"), (6,), "eval_loss", settings=GRID, remedy="the grid trained until its losses stop moving: more steps than the 300 (the paper's 90 epochs), not run"),)),
    Claim(id="admin-grid-paper", source="Admin's (lr, β₂) grid, the paper's scale",
          statement="The same at d = 512 on real translation",
          paper="7 / 0 / 0 of 15", evidence="6L-6L, d = 512, FFN 2048, Multi30k, 8000 updates (one GPU)",
          command="stabexp run experiment=admin_grid scale=paper task=multi30k",
          needs=(Cells("admin_grid_paper", tuple(paper.ADMIN_GRID_DIVERGED), (6,), settings=tuple(GRID_PAPER)),),
          criterion=_grid("admin_grid_paper", GRID_PAPER),
          section="17-the-lr-beta2-grid-without-warm-up-admins-15-settings", paper_scale_only=True,
          revised="2026-12-03, before its runs: a setting counts once however many of its runs diverged. "
                  "2026-12-04, before its runs: as admin-grid, stalls fail too and three seeds per setting (not run at the paper's scale → not run at the paper's scale).",
          cost="needs a GPU: about 3 GPU-hours for three seeds, estimated as docs/presets.md estimates one seed's hour, not measured",
          checks=(regime.some_run_diverges("admin_grid_paper", GRID_PAPER),)),
    Claim(id="admin-rezero", source="Admin's recipes (Transformer-Clinic)",
          statement="ReZero and ReZero-Post-LN land 1-2 BLEU below the other 6L-6L models",
          paper="34.66 against about 35.6", evidence=MULTI30K + ", 6L-6L",
          command="stabexp run experiment=admin_rezero",
          needs=(Cells("multi30k_table", ("rezero", "rezero_postln", "postln_warmup", "admin"), (6,), measures=("test_bleu",)),), criterion=_rezero,
          section="18-rezero-on-translation-admins-recipes",
          revised="2026-12-03, after its runs were read (none diverged): a diverged run's BLEU counts 0 (the mean had skipped it); the verdict did not change. "
                  "2026-12-04: \"partly\" when both ReZeros were below the best group alone let them sit above Post-LN with warm-up, the opposite of the claim; each ReZero must now be beaten by every other group (rules.beats), and partly means only that it is further below than 3 BLEU; admin_rezero's runs are read as multi30k_table's, whose recipe they share, so every 6L group run there counts (partly → does not hold at this scale). "
                  "2026-12-07, after an independent review: the rule compared each ReZero with every 6L group run there, where the comment's \"other models\" are those of Clinic's recipe file (Post-LN with its warm-up, Pre-LN, Admin), and \"within 3 BLEU of the best\" reached T-Fixup's 24.4; it now compares with those models only and reports the rest (does not hold at this scale → does not hold at this scale by the rule; not shown at this scale by the \"converged\" check).",
          checks=(regime.converged("multi30k_table", (*CLINIC_MODELS, *REZEROS), (6,), "valid_bleu", remedy=regime.MULTI30K_LONGER),)),
    Claim(id="admin-depths", source="Admin (Liu et al. 2020)",
          statement="Admin beats both Post-LN and Pre-LN at 6, 12 and 18 layers",
          paper="Admin 27.9 / 28.8 at 6L / 18L (DeepNet Table 1)", evidence=MULTI30K + ", 6L-18L",
          command="stabexp run experiment=multi30k_table group=postln,preln,admin depth=6,12,18 seed=0,1,2",
          needs=(Cells("multi30k_table", ("admin", "preln", "postln"), (6, 12, 18), measures=("test_bleu",)),), criterion=_admin_depths,
          section="19-admin-at-6-12-and-18-layers-on-translation",
          revised="2026-12-03: Admin must train in every seed before any comparison, and a diverged run's BLEU counts 0 (the mean had skipped it). 2026-12-05, after its 12L seeds 1 and 2 were read: \"beats\" compared means alone, with no test over seeds; it is now the paired test of rules.beats, against Post-LN as against Pre-LN (partly → partly).",
          cost="its 27 runs took 6-20 min each here, packed two at a time at one thread each (2026-11-30 to 2026-12-05, docs/data/deepnet_cells.csv); one GPU: not measured, the GPU path has not run",
          checks=(regime.converged("multi30k_table", ("admin", "preln", "postln"), (6, 12, 18), "valid_bleu", remedy=regime.MULTI30K_LONGER),)),
    Claim(id="admin-postln-deeper", source="Admin's Table 2",
          statement="Post-LN diverges at 12 and 18 layers",
          paper="diverged at 12L and 18L (WMT'14 En-De)", evidence=MULTI30K + ", 12L and 18L",
          command="stabexp run experiment=multi30k_table group=postln depth=6,12,18 seed=0,1,2",
          needs=(Cells("multi30k_table", ("postln",), (6, 12, 18), measures=("test_bleu",)),), criterion=_postln_deeper,
          section="19-admin-at-6-12-and-18-layers-on-translation",
          checks=(regime.control("multi30k_table", "postln", 6, "trains", "the same recipe trains Post-LN at 6L, so a failure deeper is the depth's"),)),
    Claim(id="admin-60l-12l-paper", source="Admin Sec. 5, the paper's scale",
          statement="A 60-layer encoder under a 12-layer decoder trains with Admin on WMT'14 En-Fr and reaches 43.8 BLEU",
          paper=f"{paper.ADMIN_60L_12L_EN_FR_BLEU} BLEU (newstest2014)",
          evidence="60L-12L, d = 512, FFN 2048, WMT'14 En-Fr, Transformer-Clinic's recipe: about 1.28M tokens per update, 44000 updates (one GPU)",
          command="stabexp run experiment=admin_60l_12l scale=paper task=wmt14_en_fr",
          needs=(Cells("admin_60l_12l_paper", ("admin",), (60,), measures=("test_bleu",)),), criterion=_deep_en_fr,
          section="30-a-60-layer-encoder-on-wmt14-en-fr-admin-sec-5", paper_scale_only=True,
          cost="needs GPUs: about 245 GPU-hours per run, 730 for Admin's three seeds, estimated as docs/presets.md estimates "
               "(6 × 260 M parameters × 1.28M tokens × 44000 updates at 100 TFLOP/s), not measured; here: out of reach",
          unchecked="the paper's own model, recipe and budget (44000 updates): the regime is the paper's, and whether Admin "
                    "trains there is the rule's"),
    Claim(id="admin-fold", source="Transformer-Clinic's and admin-torch's READMEs",
          statement="After training, Admin can be reparameterised into the original Post-LN Transformer",
          paper="a statement", evidence=ADMIN_TINY + ", 6L-6L, 600 steps, the final weights kept",
          command="stabexp run -m group=admin depth=6 train.save_model=true seed=0,1,2",
          needs=(Cells("", ("admin",), (6,), settings=("train.save_model=true",), measures=("fold_logit_error", "fold_input_scale")),), criterion=_fold,
          section="20-admin-folds-into-a-plain-post-ln-clinics-and-admin-torchs-readmes",
          unchecked="an identity of the trained weights, checked to float32 on the model's own logits: no regime enters"),
]

