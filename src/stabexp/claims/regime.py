"""The regimes in which the papers' effects can show, as checks a claim states beside its rule
(registry.Check): each reads the claim's runs and says whether the experiment could have shown
the effect (or, guarding "holds", could have failed), with the values it read. Each threshold
comes from the rule it guards or from the paper's protocol, never from the runs it reads.

- Not saturated: the model update ||F(x,θ_i) − F(x,θ_0)|| per token has a ceiling near √(2d),
  the distance of two unrelated LayerNorm outputs of norm √d (docs/methods.md, "Fits"); a rule asking for
  a ratio r between two updates can only be met where r times the smaller fits under it.
- Warm-up in effect: a rule about what warm-up holds back reads the warm-up at updates where its
  lr is still small.
- Converged: a final loss or BLEU stands for what a model reaches only where it has stopped
  moving: over the run's last quarter (analysis.last_stretch_change) by less than the smallest
  difference the claims resolve (measures.TRAINED_MARGIN nats, measures.TRAINED_BLEU BLEU).
- The failing control fails: a rule that one model fails where another trains (or that fixing one
  cause does not fix the failure) needs the model that should fail to fail in these runs.
- Some run learns: a budget in which no model leaves the input-blind plateau cannot tell a model
  that cannot train from one that has not had the time.
"""

from __future__ import annotations

import functools
import math
from typing import Iterable, Optional, Sequence

from stabexp.analysis import RATE_FROM, RATE_POINTS, RATE_TO
from stabexp.claims.measures import TRAINED_BLEU, TRAINED_MARGIN
from stabexp.claims.registry import HOLDS, REFUTING, Check, Evidence, every, over_seeds
from stabexp.claims.rules import outcome, with_setting

EVERY_VERDICT = (HOLDS, *REFUTING)


@functools.lru_cache(maxsize=None)
def preset(recipe: str, *overrides: str):
    """The config a preset's run composes (its recipe's model, schedule, probes)."""
    from stabexp.compose import compose

    return compose([f"experiment={recipe}", *overrides])


def update_ceiling(recipe: str) -> float:
    """√(2d): the per-token distance of two unrelated LayerNorm outputs of norm √d, where the
    model update of a Post-LN stack saturates (DeepNet Fig. 4 v1: 29.3 then flat near 28 at
    d = 512)."""
    return math.sqrt(2 * preset(recipe).model.d_model)


# --- not saturated ------------------------------------------------------------------------

def room_for_ratio(recipe: str, group: str, depth: int, step: int, ratio: float, rule: str, remedy: str = "") -> Check:
    """The rule asks an update `ratio` times `group`'s at `step`: that fits under the ceiling only
    where `group`'s is at most ceiling / ratio, in every seed."""
    def reading(ev: Evidence):
        ceiling = update_ceiling(recipe)
        value = ev.value(f"model_update@{step}", recipe=recipe, group=group, depth=depth)
        if value.empty:
            return None, "no update recorded"
        room = ceiling / value
        return every(room >= ratio), f"√(2d) = {ceiling:.1f} over {group}'s update {step}: {over_seeds(room, 2)}"
    return Check("not saturated",
                 f"the update's ceiling √(2d) is at least {ratio:g} times {group}'s at update {step} in every seed, "
                 f"so the {rule} fits under it", reading, remedy=remedy)


def judged_updates(ev: Evidence, recipe: str, group: str, depth: int, steps: Sequence[int], growth: float):
    """The updates of `steps` at which `group`'s update at `depth` leaves room under the ceiling
    for a `growth`-fold rise in every seed."""
    ceiling = update_ceiling(recipe)
    out = []
    for k in steps:
        value = ev.value(f"model_update@{k}", recipe=recipe, group=group, depth=depth)
        if not value.empty and every(value * growth <= ceiling):
            out.append(k)
    return out


def room_for_growth(recipe: str, group: str, depth: int, steps: Sequence[int], growth: float, remedy: str = "") -> Check:
    def reading(ev: Evidence):
        judged = judged_updates(ev, recipe, group, depth, steps, growth)
        ceiling = update_ceiling(recipe)
        parts = [f"update {k}: {over_seeds(ev.value(f'model_update@{k}', recipe=recipe, group=group, depth=depth), 2)}"
                 for k in steps]
        return bool(judged), (f"{group} at {depth}L against √(2d) / {growth:g} = {ceiling / growth:.2f}: "
                              + "; ".join(parts) + f"; judged at update {', '.join(map(str, judged)) or 'none'}")
    return Check("not saturated",
                 f"at some update the rule reads, {group}'s update at its shallowest depth ({depth}L) is at most "
                 f"a {growth:g}th of the ceiling √(2d) in every seed, so the {growth:g}x growth the rule asks for "
                 "fits under it; the rule reads only those updates", reading, remedy=remedy)


# --- warm-up in effect --------------------------------------------------------------------

# A tenth of the peak lr: a round line between the paper's schedule (0.7% of its peak at update 29)
# and a warm-up nearly done; any line from 0.0075 to 0.29 sorts the recorded presets alike.
WARMUP_SHARE = 0.1


def warmup_in_effect(recipe: str, step: int, group: str = "postln_warmup", remedy: str = "",
                     guards=REFUTING) -> Check:
    def reading(ev: Evidence):
        from stabexp.train.schedule import factor_of

        factor = factor_of(preset(recipe, f"group={group}"))(step)
        return factor <= WARMUP_SHARE, f"{group}'s lr at update {step}: {factor:.3g} of its peak"
    return Check("warm-up in effect",
                 f"at update {step}, where the rule reads the warm-up's update, {group}'s lr is at most "
                 f"{WARMUP_SHARE:g} of its peak (the paper's 4000-update warm-up from 1e-7 is at 0.7% there)", reading,
                 guards=guards, remedy=remedy)


def past_warmup(recipe: str, group: str, times: float = 2.0, remedy: str = "", guards=EVERY_VERDICT) -> Check:
    """A rule about where training settles reads runs that went on for `times` their warm-up."""
    def reading(ev: Evidence):
        train = preset(recipe, f"group={group}").train
        steps, warmup = int(train.steps), int(train.warmup_steps)
        return steps >= times * warmup, f"{group}: {steps} updates against a {warmup}-update warm-up"
    return Check("past the warm-up",
                 f"{group}'s runs go on for at least {times:g} times their warm-up, so that where its layers settle "
                 "is read after the lr's peak, not while it still rises", reading, guards=guards, remedy=remedy)


# --- converged ----------------------------------------------------------------------------

# What meets "converged" for the Multi30k recipe's 1000-update runs, and what it costs.
MULTI30K_LONGER = ("the same cells trained to convergence: train.steps=5000 (a 6L Post-LN-init reached 27.0 test BLEU "
                   "at 5000 updates, still rising, against a mean of 14.4 over three seeds at 1000: results.md section 10): "
                   "about 30 min a 6L run and 1-4 h an 18L run here, five times the recorded runs' times (estimated, not run)")

def converged(recipe: str, groups: Optional[Iterable[str]], depths: Sequence[int], metric: str,
              remedy: str = "", settings: Sequence[str] = ("",)) -> Check:
    """Every compared run that did not diverge moved its eval `metric` ("eval_loss" or
    "valid_bleu") over its last quarter by at most the claims' resolution."""
    bound = TRAINED_BLEU if metric == "valid_bleu" else TRAINED_MARGIN
    unit = "BLEU" if metric == "valid_bleu" else "nats"
    measure = f"{metric}_last_change"

    def reading(ev: Evidence):
        runs = ev.runs(recipe=recipe, group=list(groups) if groups else None, depth=list(depths), setting=list(settings))
        runs = runs[runs.status == "completed"]
        if runs.empty:
            return None, "no completed runs"
        if measure not in runs or runs[measure].isna().all():
            return None, f"none of {len(runs)} runs has an eval curve to read it from"
        read = runs.dropna(subset=[measure])
        change = read[measure].abs()
        worst = read.loc[change.idxmax()]
        moving = int((change > bound).sum())
        text = (f"{moving} of {len(read)} runs read moved more than {bound:g} {unit} over their last quarter; "
                f"most: {worst.group} {worst.depth}L seed {worst.seed} by {worst[measure]:+.3g}")
        if len(read) < len(runs):
            lacking = len(runs) - len(read)
            text += f"; {lacking} run{'s' if lacking > 1 else ''} without an eval curve"
        # One run still moving is enough to show the budget short; all still to be read is not.
        return (False if moving else None if len(read) < len(runs) else True), text
    return Check("converged",
                 f"every compared run that did not diverge moved its {metric.replace('_', ' ')} by at most {bound:g} "
                 f"{unit} over its last quarter of training (the claims' resolution), so its final value is "
                 "what it reaches, not where the budget stopped it", reading, guards=EVERY_VERDICT, remedy=remedy)


# --- controls -------------------------------------------------------------------------------

def control(recipe: str, group: str, depth: int, expected: str, why: str, remedy: str = "",
            guards=EVERY_VERDICT) -> Check:
    """The model a comparison needs `expected` ("fails" or "trains", rules.outcome) does so at
    `depth` in every seed of `recipe`: "control fails" / "control trains". Guarding only "holds":
    the runs could have failed (a claim that one model trains where another fails shows nothing
    where the other trains too)."""
    def reading(ev: Evidence):
        found = outcome(ev, recipe, group, depth)
        if found == "-":
            return None, f"no runs of {group} at {depth}L in {recipe}"
        return found == expected, f"{group} at {depth}L: {found}"
    return Check(f"control {expected}", f"{group} {expected} at {depth}L in every seed of the same recipe ({why})",
                 reading, guards=guards, remedy=remedy)


def some_run_learns(recipe: str, depth: int, remedy: str = "") -> Check:
    def reading(ev: Evidence):
        runs = ev.runs(recipe=recipe, depth=depth)
        if runs.empty or runs.trained.isna().all():
            return None, "no runs with the input-blind rule to judge by"
        return bool((runs.trained == 1).any()), f"{int((runs.trained == 1).sum())} of {len(runs)} runs leave the plateau"
    return Check("some run learns",
                 f"at least one run of the claim's cells beats the input-blind rule by {TRAINED_MARGIN:g} nats: "
                 "a budget in which none does cannot tell a model that cannot train from one not given the time",
                 reading, remedy=remedy)


def some_run_diverges(recipe: str, settings, remedy: str = "") -> Check:
    def reading(ev: Evidence):
        runs = ev.runs(recipe=recipe, setting=list(settings))
        if runs.empty:
            return None, "no runs"
        n = int((runs.status == "diverged").sum())
        return n > 0, f"{n} of {len(runs)} runs diverged"
    return Check("instability within reach",
                 "at least one run of the grid diverges: the paper's 7 of 15 are divergences, and a grid in which no "
                 "run of any model diverges sits below the lrs where the instability shows (the rule also counts a "
                 "stall at the input-blind rule as a failure, but a stall in every group at the lowest lr is the "
                 "budget's, not the instability's)", reading, remedy=remedy)


# --- attention away from uniform -------------------------------------------------------------

# A softmax with half its weight on one key: there the output's magnitude is that of the few values
# it picks, which may be larger than a typical one; under near-uniform weights the output is an
# average and ||mean v|| <= mean ||v|| whatever the values (the triangle inequality).
PEAKED = 0.5


def attention_peaked(recipe: str, groups: Sequence[str], depth: int, remedy: str = "") -> Check:
    def reading(ev: Evidence):
        runs = ev.runs(recipe=recipe, group=list(groups), depth=depth)
        if runs.empty or "attention_peak_max@end" not in runs or runs["attention_peak_max@end"].isna().all():
            return None, "the runs do not record the attention's weights at the end (probe.attention_mixing)"
        peak = runs["attention_peak_max@end"].dropna()
        return bool((peak >= PEAKED).all()), (f"largest mean top weight of an attention sublayer at the end: "
                                              f"{peak.min():.3g}-{peak.max():.3g} over {len(peak)} runs")
    return Check("attention peaked",
                 f"at the end, in every run, some attention sublayer puts on average at least {PEAKED:g} of a query's "
                 "weight on one key: only a softmax away from uniform can give an output larger than a typical "
                 "input, so only there could the lemma fail", reading, guards=(HOLDS,), remedy=remedy)


# --- spherical motion dynamics: the theorems' assumption and the probes' resolution ----------

# E||g~||^2 may move by no more than this |ln| between the approach and equilibrium: the squared
# norm's equilibrium under SGD and SGDM goes as its square root (theory.equilibrium), so within it
# the target moves by less than the rate fit's last gap RATE_TO.
SCALE_DRIFT = 2 * math.log(1 + RATE_TO)


def smd_stationary(recipe: str, settings, optimisers=("sgd", "sgdm"), remedy: str = "") -> Check:
    def reading(ev: Evidence):
        runs = ev.runs(recipe=recipe, setting=list(settings))
        runs = runs[runs.smd_rate_fitted > 0] if "smd_rate_fitted" in runs else runs.iloc[0:0]
        runs = runs[runs.setting.map(lambda x: any(f"optim={o}" in x.split() for o in optimisers))]
        if runs.empty or "smd_scale_drift" not in runs or runs.smd_scale_drift.isna().all():
            return None, "the runs do not record E‖g̃‖² over the approach (smd_scale_drift)"
        drift = runs.smd_scale_drift.dropna()
        parts = [f"{o}: {drift[with_setting(runs.loc[drift.index], 'optim', o).index].max():.3g}"
                 for o in optimisers if len(with_setting(runs.loc[drift.index], "optim", o))]
        return bool((drift <= SCALE_DRIFT).all()), ("largest |ln| of E‖g̃‖² over the approach against equilibrium "
                                                    + ", ".join(parts) + f" (at most {SCALE_DRIFT:.3f} in "
                                                    f"{int((drift <= SCALE_DRIFT).sum())} of {len(drift)} runs)")
    return Check("stationary",
                 "Theorems 1-2 hold E‖g̃‖² (the gradient's size at unit norm) constant: over each fitted approach its "
                 f"mean is within |ln| {SCALE_DRIFT:.3f} of its equilibrium value in every SGD and SGDM run (the "
                 f"equilibrium goes as its square root, so it moves by less than the fit's last gap {RATE_TO:g}); "
                 "AdamW's equilibrium does not depend on it", reading, remedy=remedy)


def smd_resolved(recipe: str, settings, remedy: str = "") -> Check:
    def reading(ev: Evidence):
        runs = ev.runs(recipe=recipe, setting=list(settings))
        if runs.empty or "smd_span_probes" not in runs or runs.smd_span_probes.isna().all():
            return None, "the runs do not record the probes' spacing against the time constant (smd_span_probes)"
        span = runs.smd_span_probes.dropna()
        short = runs.loc[span.index][span < RATE_POINTS]
        optims = sorted({part.split("=", 1)[1] for x in short.setting for part in x.split() if part.startswith("optim=")})
        return bool(short.empty), (f"the theory's approach spans {span.min():.2g}-{span.max():.2g} probe spacings; "
                                   f"fewer than {RATE_POINTS} in {len(short)} of {len(span)} runs"
                                   + (f" ({', '.join(optims)})" if optims else ""))
    return Check("resolved",
                 f"the theory's approach from a gap of {RATE_FROM:g} to {RATE_TO:g} (ln 10 time constants) spans at least "
                 f"{RATE_POINTS} probe spacings in every run, the points a fit of its rate needs: else a fast approach "
                 "has no fit and the fits keep only the slower ones", reading, guards=EVERY_VERDICT, remedy=remedy)


def not_this_quantity(what: str, instead: str) -> Check:
    """The runs measure a quantity beside the one the paper's statement is about."""
    return Check("the paper's quantity", what, lambda ev: (False, instead), guards=EVERY_VERDICT)


__all__ = ["preset", "update_ceiling", "room_for_ratio", "room_for_growth", "judged_updates", "warmup_in_effect",
           "past_warmup", "attention_peaked", "PEAKED", "converged", "control", "some_run_learns", "some_run_diverges",
           "smd_stationary", "smd_resolved", "not_this_quantity", "WARMUP_SHARE", "SCALE_DRIFT", "MULTI30K_LONGER"]
