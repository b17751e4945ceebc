"""DeepNet's claims (Wang et al. 2022, arXiv 2203.00555, figures numbered as in its v1), each with
the criterion that judges it. The criteria were written before the runs they read were looked at;
a criterion changed since says so in `revised`.
"""

from __future__ import annotations

import operator

from stabexp import paper
import stabexp.claims.regime as regime
from stabexp.claims.registry import (DOES_NOT_HOLD, HOLDS, NOT_SHOWN, PARTLY, Cells, Claim, Evidence, compare, every, mean,
                                     over_seeds, past)
from stabexp.claims.rules import beats, best_by_seed, growth, log_slope_per_seed, outcome, with_seeds

EARLY = ("postln", "postln_warmup", "postln_init")
FIG5_DEPTHS = (6, 12, 18, 25, 50, 100)
TABLE1_GROUPS = ("postln", "postln_warmup", "ds_init", "admin", "rezero", "fixup", "t_fixup", "preln", "dlcl",
                 "normformer", "deepnorm")
SYNTHETIC_DEPTHS = (6, 18, 50)
# The groups of Fig. 6 that multi30k_table and deepnet_bleu_depth run on Multi30k.
FIG6_MULTI30K = ("deepnorm", "admin", "postln", "preln", "rezero", "fixup", "t_fixup")
FIG6_GROUPS = ("deepnorm", "admin", "postln", "preln", "ds_init", "rezero", "fixup", "t_fixup", "dlcl", "normformer")


# --- Fig. 4: the first updates of an 18L-18L Post-LN ---------------------------------------

def _early(ev: Evidence, recipe: str, measure: str):
    """The measure per seed of each of Fig. 4's three groups at 18L-18L."""
    return {g: ev.value(measure, recipe=recipe, group=g, depth=18) for g in EARLY}


# Post-LN-init "lowest" at update 29: at most this fraction of each other group's update, in every
# seed. The paper's gap is 2x (10.4 against 21.6); 1/sqrt(2) is half of it on a log scale.
LOWEST_BY = 2 ** -0.5


def _fig4_update(recipe):
    def criterion(ev: Evidence):
        """Holds when, in every seed, Post-LN without warm-up moves the model at least 10 times as far
        by update 2 as Post-LN with warm-up (the jump), and Post-LN-init's update at update 29 is the
        lowest of the three by a clear margin: at most 1/√2 (0.71) of each other group's, half the
        paper's 2x gap (10.4 against 21.6) on a log scale. Partly when one of the two holds in every
        seed; otherwise it does not hold."""
        at = dict(recipe=recipe, depth=18)
        post, warm = ev.value("model_update@2", group="postln", **at).align(
            ev.value("model_update@2", group="postln_warmup", **at), join="outer")
        jump = post / warm
        late = _early(ev, recipe, "model_update@29")
        below = lambda a, b: a <= LOWEST_BY * b  # noqa: E731
        lowest = (compare(late["postln_init"], late["postln_warmup"], below)
                  & compare(late["postln_init"], late["postln"], below))
        a, b = every(jump >= 10), every(lowest)
        ratio = late["postln_init"] / late["postln_warmup"]
        measured = (f"update 2, Post-LN / with warm-up: {over_seeds(jump)}; update 29: with warm-up "
                    f"{over_seeds(late['postln_warmup'])}, Post-LN-init {over_seeds(late['postln_init'])} "
                    f"(Post-LN-init / with warm-up {over_seeds(ratio, 2)})")
        return (HOLDS if a and b else PARTLY if a or b else DOES_NOT_HOLD), measured
    return criterion


def _fig4_ln(recipe):
    def criterion(ev: Evidence):
        """Over the first 30 updates (the paper's window), the decoder's mean LN input norm at update
        30 over its value at init. Holds when, in every seed, Post-LN's grows by at least 10% and
        both Post-LN with warm-up's and Post-LN-init's stay within 5% of where they started. Partly
        when Post-LN's grows by 10% and more than warm-up's in every seed, but the other two are not
        flat; otherwise it does not hold."""
        g = _early(ev, recipe, "ln_input_growth@30")
        grows = past(g["postln"], operator.ge, 1.10, "Post-LN's growth")
        flat = (past((g["postln_warmup"] - 1).abs(), operator.le, 0.05, "with warm-up's |growth − 1|")
                & past((g["postln_init"] - 1).abs(), operator.le, 0.05, "Post-LN-init's |growth − 1|"))
        above = every(compare(g["postln"], g["postln_warmup"], operator.gt))
        measured = (f"LN input at update 30 / at init: Post-LN {over_seeds(g['postln'])}, with warm-up "
                    f"{over_seeds(g['postln_warmup'])}, Post-LN-init {over_seeds(g['postln_init'])}")
        return (HOLDS if grows and flat else PARTLY if grows and above else DOES_NOT_HOLD), measured
    return criterion


def _fig4_grad(recipe):
    def criterion(ev: Evidence):
        """At update 30, the gradient norm of decoder layer 1 over that of the decoder's largest
        layer. Holds when, in every seed, Post-LN's is below 0.01 (vanished) and Post-LN-init's is at
        least 0.1 (kept: the paper's 0.14 against 0.8 at layer 18 is 0.18); partly when only Post-LN's
        vanishes; otherwise it does not hold."""
        r = _early(ev, recipe, "grad_bottom_over_top@30")
        vanished = past(r["postln"], operator.lt, 0.01, "Post-LN's")
        kept = past(r["postln_init"], operator.ge, 0.1, "Post-LN-init's")
        measured = (f"layer 1 / largest layer at update 30: Post-LN {over_seeds(r['postln'])}, with warm-up "
                    f"{over_seeds(r['postln_warmup'])}, Post-LN-init {over_seeds(r['postln_init'])} "
                    f"(lowest seed {r['postln_init'].min():.4f})")
        return (HOLDS if vanished and kept else PARTLY if vanished else DOES_NOT_HOLD), measured
    return criterion


# --- Fig. 5: the early update against depth ------------------------------------------------

# Fig. 5's growth and level gap: Post-LN's update rises at least 3x from 6L (the paper: x5.3 at
# 40L, x5-28 at 100L), DeepNorm's sits at most a third of it (0.001-0.007 against 0.017-0.47).
FIG5_GROWTH = 3.0
FIG5_DEEP = (50, 100)  # the depths past the paper's 40L read-off


def _fig5(recipe, steps):
    def criterion(ev: Evidence):
        """Read at the updates of `steps` where Post-LN (with warm-up)'s update at the shallowest
        depth leaves room under the ceiling √(2d) for a 3x rise in every seed (regime.judged_updates:
        past it the update saturates and no growth can show). At each such update, in every seed:
        (a) DeepNorm's update is at most a third of Post-LN's at every depth (the figure's level gap,
        0.001-0.007 against 0.017-0.47); (b) Post-LN's update at each of 50L and 100L is at least 3
        times its update at the shallowest depth (the paper: x5.3 at 40L, x5-28 at 100L); (c) DeepNorm
        stays nearly constant on the figure's axis: its rise from the shallowest to the deepest depth
        is at most a third of Post-LN's rise (the paper's 0.006 against 0.07-0.45). Holds when (a),
        (b) and (c) hold at every update read; partly when (a) holds there; otherwise it does not
        hold. Not shown (the check) when no update leaves the room."""
        shallow, deepest = FIG5_DEPTHS[0], FIG5_DEPTHS[-1]
        judged = regime.judged_updates(ev, recipe, "postln_warmup", shallow, steps, FIG5_GROWTH)
        gap, grows, flat, parts = [], [], [], []
        for k in judged:
            m = f"model_update@{k}"
            post = {d: ev.value(m, recipe=recipe, group="postln_warmup", depth=d) for d in FIG5_DEPTHS}
            deep = {d: ev.value(m, recipe=recipe, group="deepnorm", depth=d) for d in FIG5_DEPTHS}
            ratios = [deep[d] / post[d] for d in FIG5_DEPTHS]
            gap.append(all(every(r <= 1 / 3) for r in ratios))
            growths = {d: post[d] / post[shallow] for d in FIG5_DEEP}
            grows.append(all(every(g >= FIG5_GROWTH) for g in growths.values()))
            rise = (deep[deepest] - deep[shallow]) / (post[deepest] - post[shallow])
            flat.append(every(rise <= 1 / 3))
            parts.append(f"update {k}: Post-LN {shallow}L→" + ", ".join(f"{d}L ×{over_seeds(g, 2)}" for d, g in growths.items())
                         + f"; DeepNorm / Post-LN at most {max(r.max() for r in ratios):.2f}; DeepNorm's rise over "
                           f"Post-LN's {over_seeds(rise, 2)}")
        measured = "; ".join(parts) if parts else "no update read (Post-LN saturated at every one)"
        if not judged:
            return NOT_SHOWN, measured
        if all(gap) and all(grows) and all(flat):
            return HOLDS, measured
        return (PARTLY if all(gap) else DOES_NOT_HOLD), measured
    return criterion


def _warmup_depth(early, sweep):
    def criterion(ev: Evidence):
        """DeepNet Sec. 3 (Fig. 3(b), Fig. 4(d)): warm-up softens the vanishing of the lower decoder
        layers' gradient but cannot prevent it as depth grows. The decoder's layer-1 gradient over
        its largest layer's at update 30 (grad_bottom_over_top@30). (a) Softens: at 18L-18L Post-LN
        with warm-up's is above Post-LN's without, in every seed. (b) Cannot prevent: along the depth
        sweep, with warm-up's at the deepest depth is below 0.01 (vanished, deepnet-fig4-grad's
        line) and below its own at the shallowest depth, in every seed. Holds when (a) and (b);
        partly when one of them; otherwise it does not hold."""
        at18 = {g: ev.value("grad_bottom_over_top@30", recipe=early, group=g, depth=18) for g in ("postln", "postln_warmup")}
        softens = every(compare(at18["postln_warmup"], at18["postln"], operator.gt))
        shallow, deepest = FIG5_DEPTHS[0], FIG5_DEPTHS[-1]
        low = ev.value("grad_bottom_over_top@30", recipe=sweep, group="postln_warmup", depth=shallow)
        deep = ev.value("grad_bottom_over_top@30", recipe=sweep, group="postln_warmup", depth=deepest)
        vanishes = every(deep < 0.01) and every(compare(deep, low, operator.lt))
        measured = (f"18L: with warm-up {over_seeds(at18['postln_warmup'], 2)}, without {over_seeds(at18['postln'], 2)}; "
                    f"with warm-up {shallow}L {over_seeds(low, 2)} → {deepest}L {over_seeds(deep, 2)}")
        return (HOLDS if softens and vanishes else PARTLY if softens or vanishes else DOES_NOT_HOLD), measured
    return criterion


# --- Table 1 and Fig. 6: which methods train at which depth --------------------------------

def _expected(group: str, depth: int) -> str:
    """Table 1's outcome for a group at a depth: a BLEU is "trains", "diverged" is "fails"; a depth
    between the table's columns takes the outcome of the nearest column at or below it."""
    row = paper.DEEPNET_TABLE1[group]
    column = max(d for d in row if d <= depth)
    return "fails" if row[column] is None else "trains"


def _table1(recipe, depths, groups):
    def criterion(ev: Evidence):
        """Each (group, depth) of DeepNet Table 1 that was run is "trains" when every seed trained
        (beat the input-blind rule, or reached 1 BLEU), "fails" when none did, else "mixed"; it agrees
        when it is the table's outcome (BLEU or diverged). Holds when every cell agrees. Partly when
        DeepNorm trains at every depth, vanilla Post-LN (either schedule) fails at every depth from
        18L on, and at least half the cells agree; otherwise it does not hold."""
        cells = [(g, d, outcome(ev, recipe, g, d), _expected(g, d)) for g in groups for d in depths]
        cells = [c for c in cells if c[2] != "-"]
        agree = [c for c in cells if c[2] == c[3]]
        deepnorm = all(outcome(ev, recipe, "deepnorm", d) == "trains" for d in depths)
        postln = all(outcome(ev, recipe, g, d) == "fails" for g in ("postln", "postln_warmup") for d in depths if d >= 18
                     if not ev.runs(recipe=recipe, group=g, depth=d).empty)
        wrong = ", ".join(f"{g} {d}L {o}" for g, d, o, e in cells if o != e)
        measured = f"{len(agree)} of {len(cells)} cells agree" + (f"; differ: {wrong}" if wrong else "")
        if len(agree) == len(cells):
            return HOLDS, measured
        return (PARTLY if deepnorm and postln and 2 * len(agree) >= len(cells) else DOES_NOT_HOLD), measured
    return criterion


def _column(recipe, depth, groups):
    def criterion(ev: Evidence):
        """DeepNet Table 1's deepest column, "at 100 layers most methods fail; DeepNet trains at
        every depth and is the best": at `depth`, (a) more than half of the groups run there other
        than DeepNorm fail (measures.with_outcome: no seed beats the input-blind rule, or every
        one diverged), (b) DeepNorm trains in every seed, (c) no group run there beats it
        (rules.beats: paired by seed, better in a majority of seeds and on the mean by more than
        the noise of the difference). Holds when all three hold; partly when (b) holds and one of
        (a) and (c); otherwise it does not hold. Each cell's agreement with the table's own column
        is reported."""
        others = [g for g in groups if g != "deepnorm" and not ev.runs(recipe=recipe, group=g, depth=depth).empty]
        found = {g: outcome(ev, recipe, g, depth) for g in others}
        failing = [g for g, o in found.items() if o == "fails"]
        most_fail = 2 * len(failing) > len(others)
        trains = outcome(ev, recipe, "deepnorm", depth) == "trains"
        best = best_by_seed(ev, recipe, depth, "deepnorm", "final_eval_loss", False)
        differ = [f"{g} {o}" for g, o in found.items() if o != _expected(g, depth)]
        measured = (f"{len(failing)} of {len(others)} other groups fail at {depth}L ({', '.join(failing) or 'none'}); "
                    f"DeepNorm {'trains' if trains else outcome(ev, recipe, 'deepnorm', depth)}, rank {best['rank']} of "
                    f"{best['of']}" + (f" (beaten by {', '.join(best['beaten_by'])})" if best["beaten_by"] else "")
                    + f"; against the table's column: {len(found) - len(differ)} of {len(found)} agree"
                    + (f" (differ: {', '.join(differ)})" if differ else ""))
        if trains and most_fail and best["best"]:
            return HOLDS, measured
        return (PARTLY if trains and (most_fail or best["best"]) else DOES_NOT_HOLD), measured
    return criterion


def _fig6(recipe, depths, groups, measure, higher_is_better):
    def criterion(ev: Evidence):
        """DeepNet Fig. 6 on the recipe's metric: (a) DeepNorm trains at every depth in every seed;
        (b) at the deepest depth no group run there beats it (rules.beats: paired by seed, better in
        a majority of seeds and on the mean by more than the noise of the difference); (c) it gains
        with depth: its deepest runs beat its shallowest by the same test; (d) Post-LN fails at every
        depth from 18L on. Holds when all four hold; partly when (a) and (d) hold; otherwise it does
        not hold."""
        deep, shallow = max(depths), min(depths)
        trains = all(outcome(ev, recipe, "deepnorm", d) == "trains" for d in depths)
        best = best_by_seed(ev, recipe, deep, "deepnorm", measure, higher_is_better)
        at_deep = ev.value(measure, recipe=recipe, group="deepnorm", depth=deep)
        at_shallow = ev.value(measure, recipe=recipe, group="deepnorm", depth=shallow)
        holds_up = beats(at_deep, at_shallow, higher_is_better)
        postln = all(outcome(ev, recipe, "postln", d) == "fails" for d in depths if d >= 18)
        name = "BLEU" if higher_is_better else "loss"
        measured = (f"DeepNorm {name} {shallow}L {over_seeds(at_shallow)} → {deep}L {over_seeds(at_deep)}; "
                    f"rank {best['rank']} of {best['of']} at {deep}L"
                    + (f" (beaten by {', '.join(best['beaten_by'])})" if best["beaten_by"] else "")
                    + f"; {'gains' if holds_up else 'no gain'} with depth"
                    + f"; Post-LN from 18L: {'fails' if postln else 'trains somewhere'}")
        if trains and best["best"] and holds_up and postln:
            return HOLDS, measured
        return (PARTLY if trains and postln and (best["best"] or holds_up) else DOES_NOT_HOLD), measured
    return criterion


def _others_lose(recipe, depths, groups, measure, higher_is_better):
    def criterion(ev: Evidence):
        """DeepNet Fig. 6: the other methods lose quality as depth grows. Each group of the figure
        other than DeepNorm, run at the shallowest and the deepest depth with three seeds: it loses
        when it fails at the deepest depth (measures.with_outcome) or its shallowest runs beat its
        deepest (rules.beats: paired by seed, better in a majority of seeds and on the mean by more
        than the noise of the difference). Holds when every such group loses; partly when most do;
        otherwise it does not hold."""
        deep, shallow = max(depths), min(depths)
        counted = set(with_seeds(ev.runs(recipe=recipe, depth=deep), measure).group)  # three seeds or more
        lost, kept = [], []
        for g in groups:
            if g == "deepnorm" or g not in counted:
                continue
            fails = outcome(ev, recipe, g, deep) == "fails"
            worse = beats(ev.value(measure, recipe=recipe, group=g, depth=shallow),
                          ev.value(measure, recipe=recipe, group=g, depth=deep), higher_is_better)
            (lost if fails or worse else kept).append(g)
        measured = (f"{len(lost)} of {len(lost) + len(kept)} lose from {shallow}L to {deep}L"
                    + (f"; hold or gain: {', '.join(kept)}" if kept else ""))
        if not lost and not kept:
            return NOT_SHOWN, measured
        return (HOLDS if not kept else PARTLY if len(lost) > len(kept) else DOES_NOT_HOLD), measured
    return criterion


def _best_from(recipe, depths, measure, higher_is_better, from_depth=18):
    def criterion(ev: Evidence):
        """DeepNet Table 1's "best from 18 layers on": at each depth run from 18L on, no group run
        there beats DeepNorm (rules.beats: paired by seed, better in a majority of seeds and on the
        mean by more than the noise of the difference). Holds at every such depth; partly at some;
        otherwise it does not hold."""
        deep = [d for d in depths if d >= from_depth]
        best = {d: best_by_seed(ev, recipe, d, "deepnorm", measure, higher_is_better) for d in deep}
        measured = "; ".join(f"{d}L rank {b['rank']} of {b['of']}"
                             + (f", beaten by {', '.join(b['beaten_by'])}" if b["beaten_by"] else ", not beaten")
                             for d, b in best.items())
        n = sum(b["best"] for b in best.values())
        return (HOLDS if n == len(deep) else PARTLY if n else DOES_NOT_HOLD), measured
    return criterion


def _fig3(ev: Evidence):
    """DeepNet Fig. 3 at 18L-18L: Post-LN-init's top layers get the larger gradient and it still
    converges better, so the gradient norm does not tell stability. Holds when, in every seed,
    Post-LN-init's gradient norm of the decoder's top layer, the mean over updates 1-30 (the
    figure's window, measures.decoder_top_grad_mean), is above Post-LN with warm-up's, and
    Post-LN-init beats it on the final eval loss (rules.beats: paired by seed, lower in a majority
    of seeds and on the mean by more than the noise of the difference); partly when its gradient
    is the larger but it does not converge better; otherwise (its gradient not the larger: the
    argument has nothing to stand on) it does not hold."""
    at = dict(recipe="deepnet_early", depth=18)
    grad = {g: ev.value("decoder_top_grad_mean", group=g, **at) for g in ("postln_warmup", "postln_init")}
    loss = {g: ev.value("final_eval_loss", group=g, **at) for g in ("postln_warmup", "postln_init")}
    larger = every(compare(grad["postln_init"], grad["postln_warmup"], operator.gt))
    better = beats(loss["postln_init"], loss["postln_warmup"], higher_is_better=False)
    measured = (f"top decoder layer's gradient, updates 1-30: with warm-up {over_seeds(grad['postln_warmup'])}, Post-LN-init "
                f"{over_seeds(grad['postln_init'])}; final loss: with warm-up {over_seeds(loss['postln_warmup'])}, "
                f"Post-LN-init {over_seeds(loss['postln_init'])}")
    return (HOLDS if larger and better else PARTLY if larger else DOES_NOT_HOLD), measured


def _fig3_gradient(recipe: str):
    def criterion(ev: Evidence):
        """DeepNet Fig. 3's first half at 18L-18L under the paper's protocol: Post-LN-init's top
        layers get the larger gradient than Post-LN with warm-up's. Holds when, in every seed,
        Post-LN-init's gradient norm of the decoder's top layer, the mean over updates 1-30
        (measures.decoder_top_grad_mean), is above Post-LN with warm-up's; does not hold when it
        is not in some seed. The second half, that it still converges better, is Fig. 3(c)'s loss
        over thousands of updates, which 30 updates cannot show: reported as not judged."""
        at = dict(recipe=recipe, depth=18)
        grad = {g: ev.value("decoder_top_grad_mean", group=g, **at) for g in ("postln_warmup", "postln_init")}
        larger = every(compare(grad["postln_init"], grad["postln_warmup"], operator.gt))
        measured = (f"top decoder layer's gradient, updates 1-30: with warm-up {over_seeds(grad['postln_warmup'])}, "
                    f"Post-LN-init {over_seeds(grad['postln_init'])}; converging better: not judged (30 updates)")
        return (HOLDS if larger else DOES_NOT_HOLD), measured
    return criterion


# DeepNet Sec. 3's account: the lower decoder layers "poorly trained" when their distance from init
# is at most this share of the top layers' (a round line, written before its runs).
POORLY_TRAINED = 0.5


def _top_settle(ev: Evidence):
    """DeepNet v1 Sec. 3 (Fig. 3(c), 4(a)) at 18L-18L: without Post-LN-init the decoder's top layers
    settle fast into a local minimum while the lower layers stay poorly trained. Read from each
    decoder layer's distance from init (probe.init_distance; measures._settling): holds when, in
    every seed, Post-LN with warm-up's lower third ends at most POORLY_TRAINED of its top third's
    distance (decoder_low_over_top_distance), its top third settles first (reaches
    measures.SETTLED of its final distance at an earlier mean step: decoder_top_over_low_settle
    below 1), and Post-LN-init's lower third is trained further, relative to its top, than Post-LN
    with warm-up's (its ratio the higher in every seed); partly when the lower layers are poorly
    trained and Post-LN-init's further, but the top does not settle first; otherwise it does not
    hold. Post-LN without warm-up is reported."""
    at = dict(recipe="deepnet_early", depth=18)
    ratio = {g: ev.value("decoder_low_over_top_distance", group=g, **at) for g in EARLY}
    settle = {g: ev.value("decoder_top_over_low_settle", group=g, **at) for g in EARLY}
    if ratio["postln_warmup"].dropna().empty or ratio["postln_init"].dropna().empty:
        return NOT_SHOWN, "the runs do not record each layer's distance from init (probe.init_distance)"
    poorly = every(ratio["postln_warmup"] <= POORLY_TRAINED)
    first = every(settle["postln_warmup"] < 1)
    contrast = every(compare(ratio["postln_init"], ratio["postln_warmup"], operator.gt))
    measured = ("decoder's lower third's distance from init over its top third's: "
                + ", ".join(f"{g} {over_seeds(ratio[g])}" for g in EARLY)
                + "; the top third's step of settling over the lower third's: "
                + ", ".join(f"{g} {over_seeds(settle[g])}" for g in EARLY))
    return (HOLDS if poorly and first and contrast else PARTLY if poorly and contrast else DOES_NOT_HOLD), measured


# Lemma 1's bound for weights that sum to 1, to float32 rounding.
CONVEX_ROUNDING = 1e-5


def _lemma1(ev: Evidence):
    """DeepNet's Lemma 1 (v1): softmax attention over its inputs has the magnitude of one input,
    so attention does not blow up the update. Read in every attention sublayer of every group of
    deepnet_early at 18L-18L, at init and at the end (probe.attention_mixing): holds when, in every
    run, the output is nowhere larger than the largest value it mixes (attention_bound_max at most
    1 + CONVEX_ROUNDING) and, per sublayer, its mean magnitude is at most that of a typical value it
    mixes (attention_gain_max at most 1, at init and at the end); partly when the first holds and
    the output exceeds a typical input somewhere; otherwise (an output beyond every input) it does
    not hold."""
    runs = ev.runs(recipe="deepnet_early", depth=18)
    need = ("attention_bound_max", "attention_gain_max@init", "attention_gain_max@end")
    if runs.empty or any(m not in runs for m in need):
        return NOT_SHOWN, "no runs record the attention's mixing (probe.attention_mixing)"
    runs = runs.dropna(subset=list(need))
    if runs.empty:
        return NOT_SHOWN, "no runs record the attention's mixing (probe.attention_mixing)"
    bound_ok = bool((runs.attention_bound_max <= 1 + CONVEX_ROUNDING).all())
    gain_ok = bool((runs["attention_gain_max@init"] <= 1).all() and (runs["attention_gain_max@end"] <= 1).all())
    measured = (f"over {len(runs)} runs ({runs.group.nunique()} groups): output against the largest value mixed at most "
                f"{runs.attention_bound_max.max():.6g}; against a typical value, largest per run at init "
                f"{runs['attention_gain_max@init'].min():.3g}-{runs['attention_gain_max@init'].max():.3g}, at the end "
                f"{runs['attention_gain_max@end'].min():.3g}-{runs['attention_gain_max@end'].max():.3g}")
    return (HOLDS if bound_ok and gain_ok else PARTLY if bound_ok else DOES_NOT_HOLD), measured


# --- deep decoder-only models, Fig. 8, 1,000 layers ----------------------------------------

def _deepnorm_trains(recipe, depth, deep_group="deepnorm", show_acc=False):
    def criterion(ev: Evidence):
        """At this depth, DeepNorm trains in a seed when its final eval loss beats the input-blind
        rule by 0.05 nats (the unigram model on text, each position's symbol frequencies on a
        symbol task). Holds when it trains in every seed; it does not hold when it fails in a seed;
        not shown where the runs hold no outcome. The failure DeepNorm's constants are to prevent,
        every Post-LN group failing at this depth, is the claim's regime check ("control fails":
        where Post-LN trains as well, DeepNorm's training shows nothing of them). DeepNorm's final
        accuracy is reported where the task has one, not judged: the claim is that it trains."""
        deep = outcome(ev, recipe, deep_group, depth)
        posts = [g for g in ("postln", "postln_warmup") if not ev.runs(recipe=recipe, group=g, depth=depth).empty]
        loss = ev.value("final_eval_loss", recipe=recipe, group=deep_group, depth=depth)
        ref = ev.runs(recipe=recipe, depth=depth)
        ref = ref.unigram_eval_loss if (ref.task == "lm").all() else ref.position_only_eval_loss
        measured = (f"DeepNorm {over_seeds(loss)}, " + ", ".join(
            f"{g} {over_seeds(ev.value('final_eval_loss', recipe=recipe, group=g, depth=depth))}" for g in posts)
            + f" (input-blind rule {mean(ref):.3f})")
        if show_acc:
            measured += f"; DeepNorm accuracy {over_seeds(ev.value('final_eval_acc', recipe=recipe, group=deep_group, depth=depth))}"
        if deep in ("fails", "mixed"):
            return DOES_NOT_HOLD, measured
        return (HOLDS if deep == "trains" else NOT_SHOWN), measured
    return criterion


def _postln_fails(recipe, depth, groups=("postln", "postln_warmup"), remedy=""):
    """The control of a claim that DeepNorm trains where Post-LN does not: each Post-LN group fails
    at this depth (guarding "holds": a DeepNorm that trains where Post-LN trains too shows nothing
    of its constants)."""
    return tuple(regime.control(recipe, g, depth, "fails", "the failure DeepNorm's constants are to prevent",
                                remedy=remedy, guards=(HOLDS,)) for g in groups)


def _depth_law(recipe, depths, paper_deepest=1000):
    def criterion(ev: Evidence):
        """Per seed, DeepNorm's final eval loss fitted as A ln(depth) + B over the depths run (the
        paper fits BLEU so). Holds when, in every seed, A < 0 with R² ≥ 0.9, no shallower depth beats
        the deepest (rules.beats, lower loss: paired by seed, lower in a majority of seeds and on the
        mean by more than the noise of the difference), and the depths reach the paper's 1,000
        layers. Partly when A < 0 in
        every seed but the fit, the order or the range falls short; it does not hold when A ≥ 0 in
        some seed."""
        runs = ev.runs(recipe=recipe, group="deepnorm")  # every depth run, `depths` at least
        fits = log_slope_per_seed(runs.loc[runs.status == "completed"], "depth", "final_eval_loss")
        means = runs.groupby("depth").final_eval_loss.mean()
        depths = sorted(runs.depth.unique())
        falling = every(fits.slope < 0) and len(fits) == runs.seed.nunique()
        deepest = ev.value("final_eval_loss", recipe=recipe, group="deepnorm", depth=max(depths))
        beaten_by = [d for d in depths[:-1] if beats(ev.value("final_eval_loss", recipe=recipe, group="deepnorm", depth=d),
                                                     deepest, higher_is_better=False)]
        good = falling and every(fits.r2 >= 0.9) and not beaten_by and max(depths) >= paper_deepest
        measured = (f"A {over_seeds(fits.slope)}, R² {over_seeds(fits.r2)} over {min(depths)}-{max(depths)} layers; "
                    f"lowest mean loss at {means.idxmin()} layers; {max(depths)} layers "
                    + (f"beaten by {', '.join(map(str, beaten_by))}" if beaten_by else "not beaten by a shallower depth"))
        return (HOLDS if good else PARTLY if falling else DOES_NOT_HOLD), measured
    return criterion


# --- Fig. 7: robustness ---------------------------------------------------------------------

ROBUSTNESS = ("base", "lr_x0.5", "lr_x1.5", "batch_x2", "batch_x4", "width_96", "width_128")
# Fig. 7's final losses under the changes, and their spread: the rule's bound on ours.
FIG7_LOSSES = [loss for change in paper.DEEPNET_ROBUSTNESS.values() for loss in change.values()]
FIG7_SPREAD = round(max(FIG7_LOSSES) - min(FIG7_LOSSES), 6)


def _robustness(ev: Evidence):
    """DeepNorm at 18L-18L under each change of lr, batch or width (conf/robustness). Holds when no
    run diverges and the mean final validation losses of the changes lie within 0.25 nats of one
    another (the paper's own spread, 3.88-4.13: FIG7_SPREAD); partly when none diverges but they spread wider;
    it does not hold when a run diverges."""
    runs = ev.runs(recipe="deepnet_robustness", group="deepnorm", setting=[f"robustness={r}" for r in ROBUSTNESS])
    diverged = int((runs.status == "diverged").sum())
    means = runs.groupby("setting").final_eval_loss.mean()
    width = means.max() - means.min()
    measured = f"final loss {means.min():.2f}-{means.max():.2f} over {len(means)} changes (spread {width:.2f}); {diverged} diverged"
    if diverged:
        return DOES_NOT_HOLD, measured
    return (HOLDS if width <= FIG7_SPREAD else PARTLY), measured


# --- Theorems 4.1 and 4.3: the bound on the model update ----------------------------------

def _bound(recipe, depths, exponent):
    def criterion(ev: Evidence):
        """(a) The bound (operator-norm reading) over the measured relative update is ≥ 1 at every
        probe step of every run: a check of the measurement, which operator norms make all but
        certain; broken anywhere, the claim does not hold. (b) At every depth and in every seed
        DeepNorm's bound at step 1 is below Post-LN's. (c) From the shallowest to the deepest depth
        Post-LN's bound grows at least twice as much as DeepNorm's, and DeepNorm's grows no faster
        than 1.25 (N_deep / N_shallow)^p: its constants shrink each term like N^(-1/2) (p = 1/2 for one
        stack; the encoder's terms carried by the cross-attentions make it 5/8 for an encoder-decoder),
        so with Adam's depth-independent step the sum cannot be held flatter than N^p. Holds when (a),
        (b) and (c) hold; partly when (a) holds and Post-LN's grows more than DeepNorm's in every
        seed; otherwise it does not hold."""
        runs = ev.runs(recipe=recipe)
        floor = runs.bound_min_ratio.min()
        post = growth(ev, recipe, "postln", "bound@1", depths)
        deep = growth(ev, recipe, "deepnorm", "bound@1", depths)
        allowed = 1.25 * (max(depths) / min(depths)) ** exponent
        below = all(every(compare(ev.value("bound@1", recipe=recipe, group="deepnorm", depth=d),
                                  ev.value("bound@1", recipe=recipe, group="postln", depth=d), operator.lt))
                    for d in depths)
        measured = (f"bound / update ≥ {floor:.2f}; bound at step 1, {min(depths)}L→{max(depths)}L: "
                    f"Post-LN ×{over_seeds(post, 2)}, DeepNorm ×{over_seeds(deep, 2)} "
                    f"(N^{exponent:g} gives ×{(max(depths) / min(depths)) ** exponent:.2f}); "
                    f"DeepNorm below Post-LN at every depth: {'yes' if below else 'no'}")
        if not floor >= 1:
            return DOES_NOT_HOLD, measured
        faster = every(compare(post, deep, operator.gt))
        if below and every(deep <= allowed) and every(compare(post, deep, lambda a, b: a >= 2 * b)):
            return HOLDS, measured
        return (PARTLY if faster else DOES_NOT_HOLD), measured
    return criterion


TINY_SORT = "tiny 64-128-2 model, sort task, Adam lr 1e-3"
# What meets "warm-up in effect" for Fig. 3 and 4, and what it costs.
FIG4_PAPER = ("the paper's protocol, deepnet_early_paper (its 4000-update warm-up from 1e-7 is at 0.7% of its peak at "
              "update 29; about 1 h a seed here)")
# Why Fig. 4's gradient claims have no regime check: what could stop the effect showing is the rule's own.
FIG4_GRAD_UNCHECKED = ("read at update 30, the end of the figure's window, on both sides of the rule: the same probe that "
                       "must read Post-LN's lower layers as vanished must read Post-LN-init's as kept, so each side is "
                       "the other's control; Post-LN's side has no warm-up, and Post-LN-init keeping its gradient under "
                       "a warm-up further along than the paper's is the harder test")
# Why the theorems' claims have no regime check.
BOUND_UNCHECKED = ("a bound measured beside the update it bounds, at step 1 of every depth: no training regime enters; "
                   "its part (a), the bound above the update at every probe step, is the measurement's own check, and "
                   "the comparison that could fail is Post-LN's growth against DeepNorm's")
LM = "decoder-only, tiny width, built-in text (BPE 512), lr 1e-3, 500 steps"
MULTI30K = "tiny model, Multi30k De-En, 1000 updates of ≤ 2048 tokens"

CLAIMS = [
    Claim(id="deepnet-fig4-update", source="DeepNet Fig. 4 (v1)",
          statement="At 18L-18L Post-LN without warm-up jumps in the first updates; with warm-up the update grows slowly; Post-LN-init lowest",
          paper="29.3 at update 2; 21.6 / 10.4 at update 29", evidence=TINY_SORT + ", 18L-18L",
          command="stabexp run experiment=deepnet_early seed=0,1,2",
          needs=(Cells("deepnet_early", EARLY, (18,), measures=("model_update@2", "model_update@29")),), criterion=_fig4_update("deepnet_early"), section="1-early-model-update-at-18l-18l-deepnet-fig-4-v1",
          revised="2026-12-03, after the three-seed runs were read: the code compared Post-LN-init with warm-up only, while the rule says the lowest of the three; it now compares with both (the verdict did not change). "
                  "2026-12-04: \"lowest\" was a strict < that one seed passed by 0.2%; it is now a margin of 1/√2, half the paper's 2x gap on a log scale (partly → does not hold at this scale).",
          checks=(regime.room_for_ratio("deepnet_early", "postln_warmup", 18, 2, 10, "10x jump", remedy="the paper's protocol meets it: stabexp run experiment=deepnet_early_paper seed=0,1,2 (claim deepnet-fig4-update-paper; about 1 h a seed here)"),
                  regime.warmup_in_effect("deepnet_early", 29, remedy="the paper's protocol meets it: stabexp run experiment=deepnet_early_paper seed=0,1,2 (claim deepnet-fig4-update-paper; about 1 h a seed here)"))),
    Claim(id="deepnet-fig4-update-paper", source="DeepNet Fig. 4 (v1), the paper's protocol",
          statement="The same, at d = 512 with the paper's recipe on real text",
          paper="29.3 at update 2; 21.6 / 10.4 at update 29", evidence="18L-18L, d = 512, the paper's Table 4 recipe, Multi30k",
          command="stabexp run experiment=deepnet_early_paper seed=0,1,2",
          needs=(Cells("deepnet_early_paper", EARLY, (18,), measures=("model_update@2", "model_update@29")),), criterion=_fig4_update("deepnet_early_paper"),
          section="1-early-model-update-at-18l-18l-deepnet-fig-4-v1",
          revised="2026-12-03: as deepnet-fig4-update, the code brought to its rule (lowest of the three). 2026-12-04: as deepnet-fig4-update, a margin of 1/√2 (not run → not run).",
          cost="about 1 h here per seed: seeds 0, 1 and 2 took 75, 57 and 54 min on 2026-12-05 (runs of 12-31 min, one at a time at two threads with other work beside some of them; two do not fit side by side in 24 GiB); one GPU: not measured, the GPU path has not run",
          checks=(regime.room_for_ratio("deepnet_early_paper", "postln_warmup", 18, 2, 10, "10x jump"),
                  regime.warmup_in_effect("deepnet_early_paper", 29))),
    Claim(id="deepnet-fig4-ln", source="DeepNet Fig. 4 (v1)",
          statement="Post-LN's LayerNorm inputs grow without warm-up, stay flat with it and with Post-LN-init",
          paper="FFN LN input 23.8 → 30.2 (×1.27); flat otherwise", evidence=TINY_SORT + ", 18L-18L",
          command="stabexp run experiment=deepnet_early seed=0,1,2",
          needs=(Cells("deepnet_early", EARLY, (18,), measures=("ln_input_growth@30",)),), criterion=_fig4_ln("deepnet_early"), section="2-layernorm-input-norms-deepnet-fig-4-v1",
          checks=(regime.warmup_in_effect("deepnet_early", 30, remedy=f"{FIG4_PAPER}: claim deepnet-fig4-ln-paper"),)),
    Claim(id="deepnet-fig4-ln-paper", source="DeepNet Fig. 4 (v1), the paper's protocol",
          statement="The same, at d = 512 with the paper's recipe on real text",
          paper="FFN LN input 23.8 → 30.2 (×1.27); flat otherwise", evidence="18L-18L, d = 512, the paper's Table 4 recipe, Multi30k",
          command="stabexp run experiment=deepnet_early_paper seed=0,1,2",
          needs=(Cells("deepnet_early_paper", EARLY, (18,), measures=("ln_input_growth@30",)),), criterion=_fig4_ln("deepnet_early_paper"), section="2-layernorm-input-norms-deepnet-fig-4-v1",
          cost="about 1 h here per seed, as deepnet-fig4-update-paper's; one GPU: not measured, the GPU path has not run",
          checks=(regime.warmup_in_effect("deepnet_early_paper", 30),)),
    Claim(id="deepnet-fig4-grad", source="DeepNet Fig. 4 (v1)",
          statement="Post-LN's gradient vanishes in the lower decoder layers; Post-LN-init keeps it",
          paper="about 0 at layer 1, 0.2 at layer 18; Post-LN-init 0.14 / 0.8", evidence=TINY_SORT + ", 18L-18L",
          command="stabexp run experiment=deepnet_early seed=0,1,2",
          needs=(Cells("deepnet_early", EARLY, (18,), measures=("grad_bottom_over_top@30",)),), criterion=_fig4_grad("deepnet_early"), section="3-gradient-per-decoder-layer-deepnet-fig-4-v1",
          revised="2026-12-04: \"Post-LN-init at least 10 times Post-LN's\" could not fail against a Post-LN ratio of 6e-8; Post-LN-init's own ratio must now reach 0.1 (the paper's 0.18) (holds → holds).",
          unchecked=FIG4_GRAD_UNCHECKED),
    Claim(id="deepnet-fig4-grad-paper", source="DeepNet Fig. 4 (v1), the paper's protocol",
          statement="The same, at d = 512 with the paper's recipe on real text",
          paper="about 0 at layer 1, 0.2 at layer 18; Post-LN-init 0.14 / 0.8", evidence="18L-18L, d = 512, the paper's Table 4 recipe, Multi30k",
          command="stabexp run experiment=deepnet_early_paper seed=0,1,2",
          needs=(Cells("deepnet_early_paper", EARLY, (18,), measures=("grad_bottom_over_top@30",)),), criterion=_fig4_grad("deepnet_early_paper"),
          section="3-gradient-per-decoder-layer-deepnet-fig-4-v1",
          revised="2026-12-04: as deepnet-fig4-grad, Post-LN-init's ratio at least 0.1 (not run → not run).",
          cost="about 1 h here per seed, as deepnet-fig4-update-paper's; one GPU: not measured, the GPU path has not run",
          unchecked=FIG4_GRAD_UNCHECKED),
    Claim(id="deepnet-fig5", source="DeepNet Fig. 5 (v1)",
          statement="The early model update grows with depth for Post-LN and stays nearly constant for DeepNorm, far below it",
          paper="Post-LN 0.017 → 0.09-0.47; DeepNorm 0.001 → 0.007 (6L → 100L)", evidence=TINY_SORT + ", 6L-100L, updates 1 and 10",
          command="stabexp run experiment=deepnet_depth seed=0,1,2",
          needs=(Cells("deepnet_depth", ("postln_warmup", "deepnorm"), FIG5_DEPTHS, measures=("model_update@1", "model_update@10")),), criterion=_fig5("deepnet_depth", (1, 10)),
          section="4-model-update-against-depth-deepnet-fig-5-v1",
          revised="2026-12-04: DeepNorm \"at most 2x from 6L to 100L\" was stricter than the figure, whose own read-offs rise 7x; the claim is the level gap and Post-LN's growth, and DeepNorm's growth is reported (does not hold at this scale → does not hold at this scale)."
                  " 2026-12-07, before its runs were read again, after an independent review: the rule tested the level gap and Post-LN's growth to the deepest depth only, and not \"DeepNorm stays nearly constant\", which the statement makes; Post-LN's growth is now read at 50L and at 100L, DeepNorm's rise must be at most a third of Post-LN's (flat on the figure's linear axis: the paper's 0.006 against 0.07-0.45), and only the updates where Post-LN's 6L update leaves room under √(2d) for a 3x rise are read (the regime check \"not saturated\") (does not hold at this scale → partly, narrowly).",
          checks=(regime.room_for_growth("deepnet_depth", "postln_warmup", FIG5_DEPTHS[0], (1, 10), FIG5_GROWTH, remedy="the update read before it saturates: a lower lr or a wider model (model=base: √(2d) = 32), not run"),)),
    Claim(id="deepnet-fig5-paper", source="DeepNet Fig. 5 (v1), the paper's protocol",
          statement="The same with the paper's recipe on real text, updates 1, 10 and 30",
          paper="Post-LN 0.017 → 0.09-0.47; DeepNorm 0.001 → 0.007 (6L → 100L)",
          evidence="64-128-2 models, the paper's Table 4 recipe, Multi30k, 6L-100L",
          command="stabexp run experiment=deepnet_depth_paper seed=0,1,2",
          needs=(Cells("deepnet_depth_paper", ("postln_warmup", "deepnorm"), FIG5_DEPTHS,
                 measures=("model_update@1", "model_update@10", "model_update@30")),),
          criterion=_fig5("deepnet_depth_paper", (1, 10, 30)), section="4-model-update-against-depth-deepnet-fig-5-v1",
          revised="2026-12-04: as deepnet-fig5, DeepNorm's growth reported, not judged (not run → not run)."
                  " 2026-12-07: as deepnet-fig5 (does not hold at this scale → does not hold at this scale).",
          cost="about 51 min here: its three seeds took 51 min packed two at a time on 2026-12-05; one GPU: not measured, the GPU path has not run",
          checks=(regime.room_for_growth("deepnet_depth_paper", "postln_warmup", FIG5_DEPTHS[0], (1, 10, 30), FIG5_GROWTH, remedy="the update read before it saturates: a lower lr or a wider model (model=base: √(2d) = 32), not run"),)),
    Claim(id="deepnet-warmup-depth", source="DeepNet Sec. 3 (Fig. 3(b), Fig. 4(d))",
          statement="Warm-up softens the vanishing of the lower decoder layers' gradient but cannot prevent it as depth grows",
          paper="qualitative", evidence=TINY_SORT + ", 18L-18L and 6L-100L, update 30",
          command="stabexp run experiment=deepnet_depth seed=0,1,2",
          needs=(Cells("deepnet_early", ("postln", "postln_warmup"), (18,), measures=("grad_bottom_over_top@30",)),
                 Cells("deepnet_depth", ("postln_warmup",), (FIG5_DEPTHS[0], FIG5_DEPTHS[-1]), measures=("grad_bottom_over_top@30",))),
          criterion=_warmup_depth("deepnet_early", "deepnet_depth"), section="4-model-update-against-depth-deepnet-fig-5-v1",
          checks=(regime.warmup_in_effect("deepnet_depth", 30, guards=regime.EVERY_VERDICT,
                                           remedy="the paper's protocol meets it: claim deepnet-warmup-depth-paper"),)),
    Claim(id="deepnet-warmup-depth-paper", source="DeepNet Sec. 3 (Fig. 3(b), Fig. 4(d)), the paper's protocol",
          statement="The same with the paper's recipe on real text",
          paper="qualitative", evidence="the paper's Table 4 recipe, Multi30k: 18L-18L at d = 512, 6L-100L at 64-128-2, update 30",
          command="stabexp run experiment=deepnet_depth_paper seed=0,1,2",
          needs=(Cells("deepnet_early_paper", ("postln", "postln_warmup"), (18,), measures=("grad_bottom_over_top@30",)),
                 Cells("deepnet_depth_paper", ("postln_warmup",), (FIG5_DEPTHS[0], FIG5_DEPTHS[-1]), measures=("grad_bottom_over_top@30",))),
          criterion=_warmup_depth("deepnet_early_paper", "deepnet_depth_paper"), section="4-model-update-against-depth-deepnet-fig-5-v1",
          checks=(regime.warmup_in_effect("deepnet_depth_paper", 30, guards=regime.EVERY_VERDICT),)),
    Claim(id="deepnet-table1-synthetic", source="DeepNet Table 1",
          statement="The Post-LN family fails as depth grows, each method at the depth the table gives; DeepNet trains at every depth",
          paper="DeepNet 27.8 / 28.8 / 29.0 BLEU at 6L / 18L / 50L; Post-LN diverges from 18L", evidence=TINY_SORT + ", 6L-50L, 300 steps",
          command="stabexp run experiment=depth_table group=postln,postln_warmup,ds_init,admin,rezero,fixup,t_fixup,preln,dlcl,normformer,deepnorm depth=6,18,50 seed=0,1,2",
          needs=(Cells("depth_table", TABLE1_GROUPS, SYNTHETIC_DEPTHS, measures=("final_eval_loss",)),), criterion=_table1("depth_table", SYNTHETIC_DEPTHS, TABLE1_GROUPS),
          section="5-depth-on-the-synthetic-task-deepnet-table-1",
          checks=(regime.control("depth_table", "postln", 18, "fails", "the table's failure within this recipe's reach: where Post-LN trains at 18L, no method's failure could show"),)),
    Claim(id="deepnet-table1-100", source="DeepNet Table 1, its 100L-100L column",
          statement="At 100 layers most methods fail; DeepNet trains there and is the best",
          paper="100L-100L: DeepNet 28.9 BLEU, Pre-LN 27.4, DLCL 27.5; the other seven diverge", evidence=TINY_SORT + ", 100L-100L, 300 steps",
          command="stabexp run experiment=depth_table group=postln,postln_warmup,ds_init,admin,rezero,fixup,t_fixup,preln,dlcl,normformer,deepnorm depth=100 seed=0,1,2",
          needs=(Cells("depth_table", TABLE1_GROUPS, (100,), measures=("final_eval_loss",)),), criterion=_column("depth_table", 100, TABLE1_GROUPS),
          section="5-depth-on-the-synthetic-task-deepnet-table-1",
          cost="33 runs of about 8 min each here (0.6 updates/s at 100L, one thread, packed two at a time; 2026-12-08), about 2 h 15 min in all; one GPU: not measured, the GPU path has not run",
          checks=(regime.control("depth_table", "postln", 100, "fails", "the column's failures within this recipe's reach: where Post-LN trains at 100L, no method's failure could show"),
                  regime.converged("depth_table", None, (100,), "eval_loss", remedy="the same cells trained until their loss stops moving (train.steps=1200, four times the 300 steps: about 9 h here, estimated, not run; whether 1200 steps meet the check is not known)"))),
    Claim(id="deepnet-table1-multi30k", source="DeepNet Table 1",
          statement="On translation Post-LN fails with depth and DeepNet trains, at 6L and 18L",
          paper="DeepNet 27.8 / 28.8 BLEU at 6L / 18L; Post-LN diverges at 18L", evidence=MULTI30K + ", 6L and 18L",
          command="stabexp run experiment=multi30k_table seed=0,1,2",
          needs=(Cells("multi30k_table", ("postln", "postln_warmup", "admin", "preln", "deepnorm"), (6, 18), measures=("test_bleu",)),),
          criterion=_table1("multi30k_table", (6, 18), ("postln", "postln_warmup", "admin", "preln", "deepnorm")),
          section="10-depth-on-real-translation-deepnet-table-1-multi30k",
          cost="about 4.5 h here: two more seeds of multi30k_table, whose one seed took 2 h 13 min on 2026-11-30; one GPU: not measured, the GPU path has not run",
          checks=(regime.control("multi30k_table", "postln", 18, "fails", "the table's failure within this recipe's reach: where Post-LN trains at 18L, no method's failure could show"),)),
    Claim(id="deepnet-fig6-synthetic", source="DeepNet Fig. 6",
          statement="DeepNet trains at every depth, gains with depth and is the best method from 50L on; Post-LN fails from 20L",
          paper="DeepNet 29.9 → 31.7 BLEU (10L → 100L), best from 50L; Post-LN 0 from 20L", evidence=TINY_SORT + ", 6L-50L, 300 steps",
          command="stabexp run experiment=depth_table group=deepnorm,admin,postln,preln,ds_init,rezero,fixup,t_fixup,dlcl,normformer depth=6,18,50 seed=0,1,2",
          needs=(Cells("depth_table", FIG6_GROUPS, SYNTHETIC_DEPTHS, measures=("final_eval_loss",)),),
          criterion=_fig6("depth_table", SYNTHETIC_DEPTHS, FIG6_GROUPS, "final_eval_loss", False),
          section="23-bleu-against-depth-for-every-method-deepnet-fig-6",
          revised="2026-12-03, before its three-seed cells were complete: DeepNorm is compared with every group run at the deepest depth, not only the groups of Fig. 6, as a comparative rule must. "
                  "2026-12-04: \"beaten\" meant a lead beyond the larger of two seed sds, which DeepNorm's own spread covered (it held at rank 6 of 11); it is now the paired test of rules.beats, and \"no worse than at 6L\" is now a gain with depth by the same test (holds → partly)."
                  " 2026-12-07, after an independent review: \"partly\" needed only that DeepNorm trains and Post-LN fails, so it stood where both of the figure's own parts (best from 50L, gains with depth) fail; partly now needs one of them (partly → does not hold at this scale by the rule; not shown at this scale by the \"converged\" check).",
          checks=(regime.converged("depth_table", None, SYNTHETIC_DEPTHS, "eval_loss", remedy="the same cells trained until their loss stops moving (train.steps=1200, four times the 300 steps: about 8 h here for depth_table's 1 h 55 min a seed, estimated, not run; whether 1200 steps meet the check is not known)"),)),
    Claim(id="deepnet-fig6-multi30k", source="DeepNet Fig. 6",
          statement="The same on translation (BLEU), at 6L-18L",
          paper="DeepNet 29.9 → 31.7 BLEU (10L → 100L); Pre-LN 29.6 → 24.2; Post-LN 0 from 20L", evidence=MULTI30K + ", 6L-18L",
          command="stabexp run experiment=deepnet_bleu_depth seed=0,1,2",
          needs=(Cells("multi30k_table", FIG6_MULTI30K, (6, 12, 18),
                 measures=("test_bleu",)),),
          criterion=_fig6("multi30k_table", (6, 12, 18), FIG6_MULTI30K,
                "test_bleu", True),
          section="23-bleu-against-depth-for-every-method-deepnet-fig-6",
          revised="2026-12-03: as deepnet-fig6-synthetic, every group run at the deepest depth. 2026-12-04: as deepnet-fig6-synthetic, the paired test and a gain with depth (not run → not run)."
                  " 2026-12-07: as deepnet-fig6-synthetic, partly needs best at the deepest depth or a gain with depth (partly → partly by the rule; not shown at this scale by the \"converged\" check).",
          cost="its 63 runs took 5-26 min each here, one thread each, packed two at a time or beside other work (2026-11-30 to 2026-12-05, docs/data/deepnet_cells.csv; seven of them have no time recorded); one GPU: not measured, the GPU path has not run",
          checks=(regime.converged("multi30k_table", None, (6, 12, 18), "valid_bleu", remedy=regime.MULTI30K_LONGER),)),
    Claim(id="deepnet-fig6-others", source="DeepNet Fig. 6",
          statement="The other methods lose quality as depth grows",
          paper="Pre-LN 29.6 → 24.2 BLEU (10L → 100L); the Post-LN family diverges", evidence=MULTI30K + ", 6L and 18L",
          command="stabexp run experiment=deepnet_bleu_depth seed=0,1,2",
          needs=(Cells("multi30k_table", FIG6_MULTI30K, (6, 18), measures=("test_bleu",)),),
          criterion=_others_lose("multi30k_table", (6, 18), FIG6_MULTI30K, "test_bleu", True),
          section="23-bleu-against-depth-for-every-method-deepnet-fig-6",
          checks=(regime.converged("multi30k_table", [g for g in FIG6_MULTI30K if g != "deepnorm"], (6, 18), "valid_bleu", remedy=regime.MULTI30K_LONGER),)),
    Claim(id="deepnet-table1-best", source="DeepNet Table 1",
          statement="DeepNet is the best method from 18 layers on",
          paper="DeepNet 28.8 / 29.0 / 28.9 BLEU at 18L / 50L / 100L, the top of each column", evidence=TINY_SORT + ", 18L and 50L, 300 steps",
          command="stabexp run experiment=depth_table group=postln,postln_warmup,ds_init,admin,rezero,fixup,t_fixup,preln,dlcl,normformer,deepnorm depth=6,18,50 seed=0,1,2",
          needs=(Cells("depth_table", TABLE1_GROUPS, SYNTHETIC_DEPTHS, measures=("final_eval_loss",)),),
          criterion=_best_from("depth_table", SYNTHETIC_DEPTHS, "final_eval_loss", False), section="5-depth-on-the-synthetic-task-deepnet-table-1",
          checks=(regime.converged("depth_table", None, (18, 50), "eval_loss", remedy="the same cells trained until their loss stops moving (train.steps=1200, four times the 300 steps: about 8 h here for depth_table's 1 h 55 min a seed, estimated, not run; whether 1200 steps meet the check is not known)"),)),
    Claim(id="deepnet-table1-best-multi30k", source="DeepNet Table 1",
          statement="The same on translation (BLEU), at 18L",
          paper="DeepNet 28.8 BLEU at 18L, the top of its column", evidence=MULTI30K + ", 18L",
          command="stabexp run experiment=deepnet_bleu_depth depth=18 seed=0,1,2",
          needs=(Cells("multi30k_table", FIG6_MULTI30K, (18,),
                 measures=("test_bleu",)),),
          criterion=_best_from("multi30k_table", (18,), "test_bleu", True), section="10-depth-on-real-translation-deepnet-table-1-multi30k",
          cost="its 18L runs took 13-52 min each here, one thread each, packed two at a time or beside other work (2026-11-30 to 2026-12-05, docs/data/deepnet_cells.csv); one GPU: not measured, the GPU path has not run",
          checks=(regime.converged("multi30k_table", None, (18,), "valid_bleu", remedy=regime.MULTI30K_LONGER),)),
    Claim(id="deepnet-fig3", source="DeepNet Fig. 3",
          statement="Post-LN-init's top layers get the larger gradient than Post-LN with warm-up's and it still converges better: the gradient norm does not tell stability",
          paper="Fig. 3(a)-(c), curves", evidence=TINY_SORT + ", 18L-18L, 300 steps",
          command="stabexp run experiment=deepnet_early group=postln_warmup,postln_init seed=0,1,2",
          needs=(Cells("deepnet_early", ("postln_warmup", "postln_init"), (18,), measures=("decoder_top_grad_mean", "final_eval_loss")),),
          criterion=_fig3, section="1-early-model-update-at-18l-18l-deepnet-fig-4-v1",
          revised="2026-12-04, after its runs were read (an independent review): \"partly\" came from the loss alone, while the claim rests on the larger gradient; partly now needs the larger gradient (partly → does not hold at this scale)."
                  " 2026-12-07, before its runs were made again, after an independent review: the rule read the whole model's mean gradient norm, where the figure and its reading (\"the top layers get the larger gradient\") are about the top layers; it now reads the decoder's top layer over updates 1-30 (measures.decoder_top_grad_mean), which the runs recorded before did not hold (does not hold at this scale → does not hold at this scale, narrowly, on the runs of 2026-12-07)."
                  " 2026-12-07, after those runs were read (a regime check, the rule unchanged): the figure compares Post-LN with warm-up and Post-LN-init, both under the paper's 4000-update warm-up, over updates 1-30, where that warm-up holds the lr under 1% of its peak; deepnet_early's 100-update warm-up is at 0.3 of its peak by update 30, so the check \"warm-up in effect\" guards its refutation (does not hold at this scale, narrowly → not shown at this scale).",
          checks=(regime.warmup_in_effect("deepnet_early", 30, remedy="the paper's protocol for the gradient: claim deepnet-fig3-paper (its runs of 2026-12-05 predate decoder_top_grad_mean; about 17 min a run here, 6 runs), and for \"converges better\" that protocol trained through the loss curve of Fig. 3(c): thousands of updates at d = 512, a GPU's work, not run"),)),
    Claim(id="deepnet-top-settle", source="DeepNet Sec. 3 (Fig. 3(c), Fig. 4(a))",
          statement="Without Post-LN-init the decoder's top layers settle fast into a local minimum while its lower layers stay poorly trained",
          paper="qualitative", evidence=TINY_SORT + ", 18L-18L, 300 steps",
          command="stabexp run experiment=deepnet_early seed=0,1,2",
          needs=(Cells("deepnet_early", EARLY, (18,), measures=("decoder_low_over_top_distance", "decoder_top_over_low_settle")),),
          criterion=_top_settle, section="1-early-model-update-at-18l-18l-deepnet-fig-4-v1",
          cost="the 18 runs of deepnet_early took 14 min here, packed two at a time (2026-12-07)",
          revised="2026-12-07, after seeds 0-2 were read, before seeds 3-5 were: the statement's \"settle into a local minimum\" is about where training ends up, so the compared runs must have stopped moving (the check \"converged\", as every claim on a final state has it; the rule unchanged) (does not hold at this scale → not shown at this scale).",
          checks=(regime.past_warmup("deepnet_early", "postln_warmup"),
                  regime.converged("deepnet_early", ("postln_warmup", "postln_init"), (18,), "eval_loss",
                                   remedy="the same runs trained until their loss stops moving: stabexp run experiment=deepnet_early group=postln_warmup,postln_init seed=0,1,2 train.steps=1200, four times the 300 steps: about 20 min packed here, four times these runs' 1-2 min each (estimated, not run; whether 1200 steps meet the check is not known)"))),
    Claim(id="deepnet-lemma1", source="DeepNet Lemma 1 (v1)",
          statement="Softmax attention over its inputs has the magnitude of one input: attention does not blow up the update",
          paper="a bound", evidence=TINY_SORT + ", 18L-18L, every group of deepnet_early, at init and after 300 steps",
          command="stabexp run experiment=deepnet_early seed=0,1,2",
          needs=(Cells("deepnet_early", ("postln", "postln_warmup", "postln_init", "deepnorm", "admin", "preln"), (18,),
                       measures=("attention_bound_max", "attention_gain_max@init", "attention_gain_max@end")),),
          criterion=_lemma1, section="1-early-model-update-at-18l-18l-deepnet-fig-4-v1",
          cost="the 18 runs of deepnet_early took 14 min here, packed two at a time (2026-12-07)",
          checks=(regime.attention_peaked("deepnet_early", ("postln", "postln_warmup", "postln_init", "deepnorm", "admin", "preln"), 18),)),
    Claim(id="deepnet-fig3-paper", source="DeepNet Fig. 3, the paper's protocol",
          statement="Under the paper's recipe, Post-LN-init's top layers get the larger gradient than Post-LN with warm-up's over updates 1-30 (Fig. 3's first half; its second, that Post-LN-init still converges better, is Fig. 3(c)'s loss over thousands of updates)",
          paper="Fig. 3(a)-(b), curves", evidence="18L-18L, d = 512, the paper's Table 4 recipe, Multi30k, 30 updates",
          command="stabexp run experiment=deepnet_early_paper group=postln_warmup,postln_init seed=0,1,2",
          needs=(Cells("deepnet_early_paper", ("postln_warmup", "postln_init"), (18,), measures=("decoder_top_grad_mean",)),),
          criterion=_fig3_gradient("deepnet_early_paper"), section="1-early-model-update-at-18l-18l-deepnet-fig-4-v1",
          cost="about 17 min a run here (the postln_init run of 2026-11-30 alone), 6 runs; one GPU: not measured, the GPU path has not run",
          checks=(regime.warmup_in_effect("deepnet_early_paper", 30),)),
    Claim(id="deepnet-table1-paper", source="DeepNet Table 1 and Fig. 6, the paper's scale",
          statement="At 50L-100L on real translation with d = 512, DeepNet trains and is the best; the Post-LN family diverges",
          paper="DeepNet 29.0 / 28.9 BLEU at 50L / 100L", evidence="d = 512, FFN 2048, Multi30k, 50L and 100L, 8000 updates (one GPU)",
          command="stabexp run experiment=multi30k_table scale=paper seed=0,1,2",
          needs=(Cells("multi30k_table_paper", ("postln_warmup", "admin", "preln", "deepnorm"), (50, 100), measures=("test_bleu",)),),
          criterion=_table1("multi30k_table_paper", (50, 100), ("postln_warmup", "admin", "preln", "deepnorm")),
          section="10-depth-on-real-translation-deepnet-table-1-multi30k", paper_scale_only=True,
          cost="needs a GPU: about 7 GPU-hours estimated from 6 × parameters × tokens at 100 TFLOP/s (docs/presets.md), not measured",
          checks=(regime.converged("multi30k_table_paper", ("admin", "preln", "deepnorm"), (50, 100), "valid_bleu",
                                   remedy="more updates than the 8000 (the paper's budget is not stated in updates), not estimated"),)),
    Claim(id="deepnet-lm-100", source="DeepNet Sec. 2.3",
          statement="DeepNorm's decoder-only constants train a 100-layer decoder-only model where Post-LN does not",
          paper="no number", evidence=LM + ", 100 layers",
          command="stabexp run experiment=lm_depth depth=100 group=postln,deepnorm seed=0,1,2",
          needs=(Cells("lm_depth", ("postln", "deepnorm"), (100,), measures=("final_eval_loss",)),), criterion=_deepnorm_trains("lm_depth", 100),
          section="11-deep-decoder-only-models-deepnet-sec-23",
          revised="2026-12-05, after an independent review: a Post-LN that trains as well made it \"partly\"; that is the claim's precondition failing, now \"not shown at this scale\" (holds → holds). 2026-12-07, after an independent review: the Post-LN control that must fail is now the regime check \"control fails\", read and printed beside the rule instead of a branch of it (the same condition; verdict unchanged).",
          checks=_postln_fails("lm_depth", 100, groups=("postln",))),
    Claim(id="deepnet-fig8", source="DeepNet Fig. 8 (v1)",
          statement="Deeper is better: quality = A log(depth) + B up to 1,000 layers",
          paper=f"{paper.DEEPNET_DEPTH_LAW[12]} → {paper.DEEPNET_DEPTH_LAW[1000]} BLEU from 12 to 1,000 layers",
          evidence=LM + ", DeepNorm at 6-200 layers",
          command="stabexp run experiment=deepnet_depth_law group=deepnorm depth=6,18,50,100,200 seed=0,1,2",
          needs=(Cells("lm_depth", ("deepnorm",), (6, 18, 50, 100, 200), measures=("final_eval_loss",)),), criterion=_depth_law("lm_depth", (6, 18, 50, 100, 200)),
          section="22-deeper-is-better-deepnet-fig-8s-law",
          revised="2026-12-03, before its seeds were run: the fit reads every depth run (500 and 1,000 layers when they exist), so that the rule's 1,000-layer condition can be met. 2026-12-05, after an independent review: \"the deepest depth has the lowest mean loss\" compared means alone; it is now that no shallower depth beats the deepest by rules.beats' paired test (partly → partly).",
          cost="about 45 min here: depths 6-200 of deepnet_depth_law took 44 min 51 s for one seed of its two groups on 2026-12-01; one GPU: not measured, the GPU path has not run",
          checks=(regime.converged("lm_depth", ("deepnorm",), (6, 18, 50, 100, 200), "eval_loss", remedy="DeepNorm's depths trained until the loss stops moving (train.steps=2000, four times the 500 steps: about 3 h a seed here, estimated from deepnet_depth_law's 45 min, not run)"),)),
    Claim(id="deepnet-1000-layers", source="DeepNet's title",
          statement="A 1,000-layer Transformer (500L-500L, 2,500 sublayers) trains where Post-LN does not",
          paper=f"{paper.DEEPNET_DEPTH_LAW[1000]} BLEU at 1,000 layers (OPUS-100)", evidence=TINY_SORT + ", 500L-500L, 200 steps",
          command="stabexp run experiment=deepnet_1000_layers seed=0,1,2",
          needs=(Cells("deepnet_1000_layers", ("deepnorm", "postln", "postln_warmup"), (500,),
                 measures=("final_eval_loss", "final_eval_acc")),),
          criterion=_deepnorm_trains("deepnet_1000_layers", 500, show_acc=True), section="21-a-thousand-layers-deepnets-title",
          revised="2026-12-05, before its seeds 1 and 2 were read, after an independent review: the statement said \"to the best quality of the paper's models\", which the rule never tested and this preset (one depth) cannot; quality against depth is deepnet-fig8's claim, and the statement now says what the rule tests. A Post-LN that trains as well is the precondition failing: not shown, no longer partly (not run → not run)."
                  " 2026-12-07, after an independent review: \"partly\" came from DeepNorm's accuracy below 0.9, which the sentence (\"trains where Post-LN does not\") does not ask; the accuracy is reported, not judged: a loosening, made after the runs were read (partly → holds). 2026-12-07, after an independent review: the Post-LN control that must fail is now the regime check \"control fails\", read and printed beside the rule instead of a branch of it (the same condition; verdict unchanged).",
          cost="about 33 min here per seed, its three runs packed two at a time: 200 steps at 5.6-7.9 s each, one thread per run (seeds 1 and 2, 2026-12-06, docs/data/deepnet_cells.csv; 66 min for the six); one GPU: not measured, the GPU path has not run",
          checks=_postln_fails("deepnet_1000_layers", 500)),
    Claim(id="deepnet-1000-layers-lm", source="DeepNet's title, decoder-only",
          statement="A 1,000-layer decoder-only model trains with DeepNorm",
          paper="no number", evidence=LM.replace("500 steps", "200 steps") + ", 1,000 layers",
          command="stabexp run experiment=lm_1000_layers seed=0,1,2",
          needs=(Cells("lm_1000_layers", ("deepnorm", "postln", "postln_warmup"), (1000,), measures=("final_eval_loss",)),),
          criterion=_deepnorm_trains("lm_1000_layers", 1000), section="21-a-thousand-layers-deepnets-title",
          revised="2026-12-05, before its seeds 1 and 2 were read, after an independent review: a Post-LN that trains as well is the precondition failing: not shown, no longer partly (not run → not run). 2026-12-07, after an independent review: the Post-LN control that must fail is now the regime check \"control fails\", read and printed beside the rule instead of a branch of it (the same condition; verdict unchanged).",
          cost="about 28 min here per seed, its three runs packed two at a time: 200 steps at 5.0-5.7 s each, one thread per run (seeds 1 and 2, 2026-12-06, docs/data/deepnet_cells.csv); one GPU: not measured, the GPU path has not run",
          checks=(*_postln_fails("lm_1000_layers", 1000),
                  regime.some_run_learns("lm_1000_layers", 1000, remedy="stabexp run experiment=lm_1000_layers train.steps=1000 seed=0,1,2 (five times the 200 steps: about 1.4 h a run at 5 s a step, 7 h for the three groups of a seed packed two at a time here; estimated, not run; the 100-layer DeepNorm of lm_depth leaves the plateau between steps 100 and 200)"),)),
    Claim(id="deepnet-fig7", source="DeepNet Fig. 7 (v1)",
          statement="An 18L-18L DeepNet's validation loss stays close under lr × 0.5 / 1.5, batch × 2 / 4, width 1.5× / 2×",
          paper=f"final {min(FIG7_LOSSES):.2f}-{max(FIG7_LOSSES):.2f} (WMT-17)", evidence=MULTI30K + ", 18L-18L",
          command="stabexp run experiment=deepnet_robustness group=deepnorm seed=0,1,2",
          needs=(Cells("deepnet_robustness", ("deepnorm",), (18,), settings=tuple(f"robustness={r}" for r in ROBUSTNESS),
                 measures=("final_eval_loss",)),),
          criterion=_robustness, section="29-robustness-of-deepnet-to-its-hyper-parameters-deepnet-fig-7",
          cost="about 10 h here: 15 runs × 39 min, the mean of its 12 recorded runs (deepnet_robustness' cost line); one GPU: not measured, the GPU path has not run",
          checks=(regime.converged("deepnet_robustness", ("deepnorm",), (18,), "eval_loss", settings=tuple(f"robustness={r}" for r in ROBUSTNESS),
                                   remedy="the changes trained until their losses stop moving: more than the 1000 updates, not estimated"),)),
    Claim(id="deepnet-thm41", source="DeepNet Theorem 4.1",
          statement="‖ΔF‖ ≤ Σ √(v² + w²)/α ‖Δθ‖; Post-LN's sum grows with depth, DeepNorm's is held down",
          paper="no measured value", evidence=LM.replace("500 steps", "200 steps") + ", 6-100 layers",
          command="stabexp run experiment=deepnet_bound seed=0,1,2",
          needs=(Cells("deepnet_bound", ("postln", "postln_init", "deepnorm"), (6, 18, 50, 100), measures=("bound_min_ratio", "bound@1")),),
          criterion=_bound("deepnet_bound", (6, 18, 50, 100), 1 / 2), section="24-deepnets-bound-on-the-model-update-measured-theorem-41",
          unchecked=BOUND_UNCHECKED,
          revised="2026-12-04, before its runs: \"bound / update ≥ 1\" alone is all but certain with operator norms, and \"DeepNorm's bound grows at most 2x\" is impossible with Adam's depth-independent step (√N: 4.1x from 6L to 100L); DeepNorm's bound must now be below Post-LN's at every depth and grow no faster than 1.25 √N (not run → not run).",
          cost="about 55 min here: deepnet_bound's one seed took 18 min 15 s on 2026-12-01 at one thread with other work sharing the cores; one GPU: not measured, the GPU path has not run"),
    Claim(id="deepnet-thm43", source="DeepNet Theorem 4.3",
          statement="The encoder-decoder bound, the encoder's sum carried by the cross-attentions; DeepNorm's constants hold it down",
          paper="no measured value", evidence=TINY_SORT + ", 6L-6L to 50L-50L, 200 steps",
          command="stabexp run experiment=deepnet_bound_encdec seed=0,1,2",
          needs=(Cells("deepnet_bound_encdec", ("postln", "postln_init", "deepnorm"), (6, 18, 50), measures=("bound_min_ratio", "bound@1")),),
          criterion=_bound("deepnet_bound_encdec", (6, 18, 50), 5 / 8), section="28-deepnets-encoder-decoder-bound-measured-theorem-43",
          unchecked=BOUND_UNCHECKED,
          revised="2026-12-04, before its runs: as deepnet-thm41, with the encoder-decoder constants' N^(5/8) (not run → not run).",
          cost="about 17 min here: its three seeds took 16 min 23 s packed two at a time on 2026-12-05; one GPU: not measured, the GPU path has not run"),
]
