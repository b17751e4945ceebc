"""What a claim is, what a verdict is, and how one is computed from the runs.

A claim is one statement of a paper, the paper's number for it, the recipes whose runs test it,
the cells (group x depth) and seeds it needs, and a criterion: a function of the runs' measures
(stabexp.claims.measures) that says "holds", "partly" or "does not hold at this scale". The
criterion is written before its runs are looked at; when one is changed after, `revised` says
when, why, and the verdict before and after. A claim whose cells lack seeds is "not run" whatever
its criterion would say; one that only the paper's scale can show is "not run at the paper's
scale" until runs at that scale exist. A claim whose precondition the runs do not meet (the
unclipped logits never exceed the clip's threshold; Pre-LN's stream does not grow) is "not shown
at this scale": the runs cannot test it, whichever way its own comparison falls.

A claim also states the regime in which its effect can show, as measured checks beside its rule
(`Check`): the update below its ceiling, the failing control failing, the compared runs converged,
a theorem's assumption met, probes fine enough. Each is read on the claim's runs and printed with
its value; a verdict stands only where every check that guards it is met, else it is "not shown
at this scale" with the check named and what a run that meets it costs. A check that guards
"holds" asks that the runs could have failed. A verdict that one seed moves says so (`narrowly`):
one seed left out changes it, or a threshold test of a "holds" has its nearest seed within one
sd over seeds of the threshold.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

HOLDS = "holds"
PARTLY = "partly"
DOES_NOT_HOLD = "does not hold at this scale"
NOT_SHOWN = "not shown at this scale"
NOT_RUN = "not run"
NOT_RUN_PAPER = "not run at the paper's scale"
VERDICTS = (HOLDS, PARTLY, DOES_NOT_HOLD, NOT_SHOWN, NOT_RUN, NOT_RUN_PAPER)

FINISHED = ("completed", "diverged")


@dataclass(frozen=True)
class Cells:
    """Runs a claim needs: every group at every depth (and every one of `settings`) of one recipe,
    `seeds` seeds each, finished (completed or diverged) and holding every one of `measures` (a
    run that lacks one, say a recorded cell without the probe's summary, does not count).
    `depths` empty: any depth; `settings`: the runs' settings as analysis.setting writes them
    ("": none of their own)."""
    recipe: str
    groups: Tuple[str, ...]
    depths: Tuple[int, ...] = ()
    seeds: int = 3
    settings: Tuple[str, ...] = ("",)
    measures: Tuple[str, ...] = ()


# The verdicts that say the paper's effect, or part of it, is absent: a check of the regime in
# which the effect can show guards these by default.
REFUTING = (DOES_NOT_HOLD, PARTLY)


@dataclass(frozen=True)
class Check:
    """A condition of the regime in which a claim's effect can show, read on the claim's runs.
    `reading(evidence)` returns (met, measured): met True or False, or None where the runs do not
    hold what it reads (which blocks as "not met": a regime not measured is not shown); measured
    the values read, in words. The claim's verdict, when it is one of `guards`, stands only if the
    check is met; else it is "not shown at this scale", with `remedy`: the run that would meet the
    check and its cost."""
    name: str                         # short: "not saturated", "control fails", "converged", ...
    condition: str                    # the condition in words, its threshold and where it comes from
    reading: Callable[["Evidence"], Tuple[Optional[bool], str]]
    guards: Tuple[str, ...] = REFUTING  # (HOLDS,): the runs could have failed
    remedy: str = ""                  # the run that meets it, and what that costs


@dataclass(frozen=True)
class CheckReading:
    check: Check
    met: Optional[bool]
    measured: str

    def as_dict(self) -> Dict:
        return {"name": self.check.name, "condition": self.check.condition, "met": self.met,
                "measured": self.measured, "guards": list(self.check.guards), "remedy": self.check.remedy}

    def text(self) -> str:
        mark = "met" if self.met else "not met" if self.met is False else "not measured"
        return f"{self.check.name}: {mark} ({self.measured})"


@dataclass(frozen=True, kw_only=True)  # many fields: each named where a claim is written
class Claim:
    id: str                         # short, stable: `stabexp claims --json` keys on it
    source: str                     # the paper and where in it ("DeepNet Fig. 5 (v1)")
    statement: str                  # the claim, as the paper makes it
    paper: str                      # the paper's number for it (src/stabexp/paper.py)
    evidence: str                   # the scale and task its runs are at
    command: str                    # what makes its runs
    needs: Tuple[Cells, ...]        # the runs it reads
    criterion: Callable[["Evidence"], Tuple[str, str]]  # -> (verdict, measured); the rule is its docstring
    section: str = ""               # docs/results.md anchor
    paper_scale_only: bool = False  # only the paper's scale can show it: never judged on a substitute
    cost: str = ""                  # what `command` costs here (2 cores) and on one GPU, and how that is known
    revised: str = ""               # a criterion changed: when, why, and the verdict before -> after
    checks: Tuple[Check, ...] = ()  # the regime its effect can show in, measured beside the rule
    unchecked: str = ""             # no check: why no regime conditions the effect (at init, an identity)

    @property
    def rule(self) -> str:
        return " ".join((self.criterion.__doc__ or "").split())


@dataclass
class Result:
    claim: Claim
    verdict: str
    measured: str
    runs: int
    missing: List[str] = field(default_factory=list)
    dates: str = ""  # the dates of the runs read ("2026-12-03", "2026-12-01 to 2026-12-04"), "" without runs
    checks: List[CheckReading] = field(default_factory=list)
    rule_verdict: str = ""  # what the criterion says before the checks
    narrowly: str = ""      # why one seed could move the verdict, "" where none does

    @property
    def blocking(self) -> List[CheckReading]:
        """The checks that made the rule's verdict "not shown at this scale"."""
        if self.verdict != NOT_SHOWN or self.rule_verdict == NOT_SHOWN:
            return []
        return [r for r in self.checks if self.rule_verdict in r.check.guards and r.met is not True]

    def verdict_text(self) -> str:
        """The verdict, with the check that stopped it or the seed that moves it."""
        text = f"**{self.verdict}**"
        if self.blocking:
            text += " (" + "; ".join(f"{r.check.name}: not {'met' if r.met is False else 'measured'}"
                                     for r in self.blocking) + f"; the rule alone: {self.rule_verdict})"
        elif self.narrowly:
            text += f" (narrowly: {self.narrowly})"
        return text

    def checks_text(self) -> str:
        """Each regime check with its reading (those not read: the claim has no runs yet), or why
        none applies."""
        if self.checks:
            return "; ".join(reading.text() for reading in self.checks)
        if self.claim.checks:
            return "; ".join(f"{c.name}: not read (no runs)" for c in self.claim.checks)
        return f"none: {self.claim.unchecked}" if self.claim.unchecked else "-"

    def as_dict(self) -> Dict:
        c = self.claim
        return {"id": c.id, "source": c.source, "statement": c.statement, "paper": c.paper,
                "evidence": c.evidence, "dates": self.dates, "measured": self.measured, "verdict": self.verdict,
                "rule_verdict": self.rule_verdict, "narrowly": self.narrowly,
                "checks": [r.as_dict() for r in self.checks], "unchecked": c.unchecked,
                "runs": self.runs, "missing": self.missing, "criterion": c.rule, "command": c.command,
                "cost": c.cost, "section": c.section, "revised": c.revised}


def value_as_hydra_writes(value: str) -> str:
    """A sweep value as Hydra records it in a run's overrides: a float or a bool in Python's own
    spelling (3e-4 -> 0.0003, false -> False), anything else as written."""
    text = str(value)
    if text.lower() in ("true", "false"):
        return text.capitalize()
    if any(c in text.lower() for c in ".e") and not text.startswith("["):
        try:
            return str(float(text))
        except ValueError:
            pass
    return text


def normal_setting(setting: str) -> str:
    """A setting with every value as Hydra writes it, its parts sorted."""
    parts = [p.split("=", 1) for p in str(setting).split() if "=" in p]
    return " ".join(sorted(f"{k}={value_as_hydra_writes(v)}" for k, v in parts))


class Evidence:
    """The finished runs of a claim's recipes, one row per run: key columns (recipe, scale, group,
    depth, decoder_depth, seed, setting), task, status, and one column per measure."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame

    def runs(self, recipe=None, group=None, depth=None, setting: Optional[str] = "", **where) -> pd.DataFrame:
        f = self.frame
        if f.empty:
            return f
        if setting is not None:  # as Hydra spells a run's overrides (measures.py keeps them so)
            setting = [normal_setting(x) for x in setting] if isinstance(setting, (list, tuple, set)) else normal_setting(setting)
        # One mask, one take: the frame is wide (a column per measure), so each take copies it all.
        mask = np.ones(len(f), dtype=bool)
        for key, value in (("recipe", recipe), ("group", group), ("depth", depth), ("setting", setting), *where.items()):
            if value is None:
                continue
            column = f[key]
            match = column.isin(value) if isinstance(value, (list, tuple, set)) else column == value
            mask &= match.fillna(False).to_numpy(dtype=bool)
        return f[mask]

    def value(self, measure: str, **where) -> pd.Series:
        """The measure per seed (NaN where a run lacks it) of the runs matching `where`, which must
        name one run per seed."""
        runs = self.runs(**where)
        if measure not in runs:
            return pd.Series(dtype=float)
        if runs.seed.duplicated().any():
            raise ValueError(f"two runs of one seed match {where}: name the depth or setting that tells them apart")
        return runs.set_index("seed")[measure].astype(float).sort_index()


def seeds_found(evidence: Evidence, cells: Cells) -> Dict[Tuple[str, Optional[int], str], int]:
    found = {}
    for group in cells.groups:
        for depth in cells.depths or (None,):
            for setting in cells.settings:
                runs = evidence.runs(recipe=cells.recipe, group=group, depth=depth, setting=setting)
                for measure in cells.measures:
                    runs = runs[runs[measure].notna()] if measure in runs else runs.iloc[0:0]
                found[(group, depth, setting)] = runs.seed.nunique() if not runs.empty else 0
    return found


def missing_cells(evidence: Evidence, needs: Sequence[Cells]) -> List[str]:
    """Per recipe and group: the cells (depth, setting) with fewer finished seeds than the claim
    needs, one line each, a sweep's many settings counted in one line."""
    out = []
    for cells in needs:
        short = {}
        for (group, depth, setting), n in seeds_found(evidence, cells).items():
            if n < cells.seeds:
                where = f"{group}" + (f" {depth}L" if depth is not None else "")
                short.setdefault(where, []).append((setting, n))
        for where, lacking in short.items():
            if len(cells.settings) > 1:
                fewest = min(n for _, n in lacking)
                out.append(f"{cells.recipe or 'runs without a preset'}: {where}, {len(lacking)} of {len(cells.settings)} settings "
                           f"short of {cells.seeds} seeds (fewest {fewest})")
            else:
                setting, n = lacking[0]
                recipe = cells.recipe or "runs without a preset"
                out.append(f"{recipe}{' ' + setting if setting else ''}: {where}, {n} of {cells.seeds} seeds")
    return out


def evaluate(claim: Claim, evidence: Evidence) -> Result:
    """The claim's verdict on these runs: its criterion's where every needed cell has its seeds
    and every check guarding that verdict is met (else "not shown at this scale"), else "not run"
    (or "not run at the paper's scale"), with what the runs there show so far."""
    recipes = {c.recipe for c in claim.needs}
    mine = Evidence(evidence.frame[evidence.frame.recipe.isin(recipes)] if not evidence.frame.empty else evidence.frame)
    missing = missing_cells(mine, claim.needs)
    measured, verdict, margins = "-", None, []
    if not mine.frame.empty:
        try:
            with _noting_margins() as margins:
                verdict, measured = claim.criterion(mine)
        except (KeyError, ValueError, IndexError, ZeroDivisionError, TypeError, AttributeError):
            if not missing:
                raise
            verdict, measured = None, "-"  # too few runs for the criterion's reading yet
    read, dates = runs_read(mine, claim.needs)
    checks = [read_check(c, mine, strict=not missing) for c in claim.checks] if read else []
    rule_verdict, narrowly = verdict, ""
    if missing:
        verdict = NOT_RUN_PAPER if claim.paper_scale_only else NOT_RUN
        if not read:
            measured = "-"
        elif measured != "-":
            measured = f"so far: {measured}"
    elif verdict in (HOLDS, PARTLY, DOES_NOT_HOLD):
        verdict = _after_checks(verdict, checks)
        if verdict != NOT_SHOWN:
            narrowly = one_seed_moves(claim, mine, verdict)
            if not narrowly and verdict == HOLDS:
                narrowly = "; ".join(m for m in margins if m)
    if verdict not in VERDICTS:
        raise ValueError(f"claim {claim.id}: criterion returned {verdict!r}, not one of {VERDICTS}")
    return Result(claim, verdict, measured, read, missing, dates, checks, rule_verdict or "", narrowly)


def read_check(check: Check, evidence: Evidence, strict: bool = True) -> CheckReading:
    """A check read on the claim's runs. A check says itself where the runs lack what it reads
    (met None); one that fails on runs holding every cell is a bug and raises, unless not `strict`
    (the runs short of a cell or a seed)."""
    try:
        met, measured = check.reading(evidence)
    except (KeyError, ValueError, IndexError, ZeroDivisionError, TypeError, AttributeError):
        if strict:
            raise
        met, measured = None, "the runs do not hold what it reads"
    return CheckReading(check, None if met is None else bool(met), measured)


def _after_checks(verdict: str, checks: Sequence[CheckReading]) -> str:
    return NOT_SHOWN if any(verdict in r.check.guards and r.met is not True for r in checks) else verdict


# --- a verdict that one seed moves --------------------------------------------------------

_WHOLE = contextvars.ContextVar("evidence_before_a_seed_left_out", default=None)


def whole_evidence() -> Optional[pd.DataFrame]:
    """While `one_seed_moves` reads the runs with a seed left out, the runs before it was: what a
    rule that counts the groups with enough seeds counts on (rules.with_seeds), so that leaving a
    seed out changes the seeds compared, never which groups are."""
    return _WHOLE.get()


def one_seed_moves(claim: Claim, evidence: Evidence, verdict: str) -> str:
    """The verdict with each seed left out in turn (the criterion and the checks read again): the
    first seed whose absence changes it, as "without seed S: VERDICT", or "" where none does or
    the runs have fewer than three seeds."""
    seeds = sorted(evidence.frame.seed.dropna().unique())
    if len(seeds) < 3:
        return ""
    token = _WHOLE.set(evidence.frame)
    try:
        for seed in seeds:
            rest = Evidence(evidence.frame[evidence.frame.seed != seed])
            try:
                other, _ = claim.criterion(rest)
            except (KeyError, ValueError, IndexError, ZeroDivisionError, TypeError, AttributeError):
                continue
            if other in (HOLDS, PARTLY, DOES_NOT_HOLD):
                other = _after_checks(other, [read_check(c, rest, strict=False) for c in claim.checks])
            if other != verdict:
                return f"without seed {seed}: {other}"
    finally:
        _WHOLE.reset(token)
    return ""


_MARGINS = contextvars.ContextVar("threshold_margins", default=None)


@contextlib.contextmanager
def _noting_margins():
    notes: List[str] = []
    token = _MARGINS.set(notes)
    try:
        yield notes
    finally:
        _MARGINS.reset(token)


def past(values: pd.Series, op, limit: float, what: str = "") -> bool:
    """every(op(v, limit)) over the seeds (op: operator.ge, gt, le or lt), a threshold test whose
    margin `evaluate` keeps: the test is narrow where its deciding seed (the lowest against a lower
    limit, the highest against an upper one) lies within one sample sd over the seeds of the limit,
    where the next seed could fall on the other side."""
    v = pd.Series(values, dtype=float)
    result = every(op(v, limit))
    finite = v[np.isfinite(v)]
    notes = _MARGINS.get()
    if notes is not None and len(finite) >= 2:
        deciding = finite.min() if op in (operator.ge, operator.gt) else finite.max()
        sd = finite.std(ddof=1)
        if abs(deciding - limit) <= sd:
            notes.append(f"{what + ' ' if what else ''}{deciding:.4g} against {limit:g}, within its sd {sd:.2g}")
    return result


def runs_read(evidence: Evidence, needs: Sequence[Cells]) -> Tuple[int, str]:
    """How many finished runs the claim's cells hold, and the span of their dates."""
    found, dates = set(), set()
    for cells in needs:
        runs = evidence.runs(recipe=cells.recipe, group=list(cells.groups), depth=list(cells.depths) or None,
                             setting=list(cells.settings))
        found |= set(zip(runs.recipe, runs.group, runs.depth.astype(str), runs.seed, runs.setting))
        if "date" in runs:
            dates |= {str(d) for d in runs.date.dropna() if str(d)}
    span = "" if not dates else min(dates) if len(dates) == 1 else f"{min(dates)} to {max(dates)}"
    return len(found), span


# --- what criteria share ------------------------------------------------------------------

def compare(a: pd.Series, b: pd.Series, op) -> pd.Series:
    """op(a, b) seed by seed over the seeds either has; False where one lacks the seed or is NaN."""
    a, b = a.align(b, join="outer")
    return pd.Series([bool(op(x, y)) if x == x and y == y else False for x, y in zip(a, b)], index=a.index,
                     dtype=object)


def every(values) -> bool:
    """True when there is at least one value and every one is true (NaN is not)."""
    v = list(values)
    return bool(v) and all(bool(x) and x == x for x in v)


def over_seeds(values, digits: int = 3) -> str:
    """mean ± sample sd (n) of a value measured once per seed; the value alone for one seed."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if v.size == 0:
        return "-"
    if v.size == 1:
        return f"{v[0]:.{digits}g} (1 seed)"
    return f"{v.mean():.{digits}g} ± {v.std(ddof=1):.2g} ({v.size} seeds)"


def mean(values) -> float:
    v = [x for x in values if x == x]
    return float(np.mean(v)) if v else float("nan")
