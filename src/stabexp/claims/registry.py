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
"""

from __future__ import annotations

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


@dataclass(frozen=True, kw_only=True)  # ten fields: each named where a claim is written
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

    def as_dict(self) -> Dict:
        c = self.claim
        return {"id": c.id, "source": c.source, "statement": c.statement, "paper": c.paper,
                "evidence": c.evidence, "dates": self.dates, "measured": self.measured, "verdict": self.verdict,
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
        for key, value in (("recipe", recipe), ("group", group), ("depth", depth), ("setting", setting), *where.items()):
            if value is None:
                continue
            f = f[f[key].isin(value)] if isinstance(value, (list, tuple, set)) else f[f[key] == value]
        return f

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
    """The claim's verdict on these runs: its criterion's where every needed cell has its seeds,
    else "not run" (or "not run at the paper's scale"), with what the runs there show so far."""
    recipes = {c.recipe for c in claim.needs}
    mine = Evidence(evidence.frame[evidence.frame.recipe.isin(recipes)] if not evidence.frame.empty else evidence.frame)
    missing = missing_cells(mine, claim.needs)
    measured = "-"
    verdict = None
    if not mine.frame.empty:
        try:
            verdict, measured = claim.criterion(mine)
        except (KeyError, ValueError, IndexError, ZeroDivisionError, TypeError, AttributeError):
            if not missing:
                raise
            verdict, measured = None, "-"  # too few runs for the criterion's reading yet
    read, dates = runs_read(mine, claim.needs)
    if missing:
        verdict = NOT_RUN_PAPER if claim.paper_scale_only else NOT_RUN
        if not read:
            measured = "-"
        elif measured != "-":
            measured = f"so far: {measured}"
    if verdict not in VERDICTS:
        raise ValueError(f"claim {claim.id}: criterion returned {verdict!r}, not one of {VERDICTS}")
    return Result(claim, verdict, measured, read, missing, dates)


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
