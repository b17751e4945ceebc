"""Every claim stabexp tests, judged by rule from the runs on disk: `stabexp claims`.

A claim (registry.Claim) is a paper's statement and number, the recipes and cells whose runs test
it, the seeds it needs, and a criterion in code. The evidence is one row per finished run of
named measures (measures.py), read from run folders and from the tables recorded under
docs/data/ (`stabexp claims --record`), so that a fresh clone judges every claim the same way the
machine that ran them did. The README's and docs/results.md's verdict tables are this module's
`markdown` output; a docs test fails when they differ.

Adding a claim: a criterion function (docstring = the rule in words, thresholds in the code), a
`Claim` entry in the paper's module (deepnet.py, admin.py, others.py), and a test on synthetic
evidence in tests/test_claims.py that flips its verdict across each threshold.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, List, Optional

import pandas as pd

from stabexp.claims import admin, deepnet, others
from stabexp.claims.measures import from_run_folders, merge, read_recorded, wide
from stabexp.claims.registry import VERDICTS, Claim, Evidence, Result, evaluate


def _section_number(claim: Claim) -> int:
    match = re.match(r"(\d+)-", claim.section)
    return int(match.group(1)) if match else 999


# In the order of docs/results.md's sections.
CLAIMS: List[Claim] = sorted([*deepnet.CLAIMS, *admin.CLAIMS, *others.CLAIMS], key=_section_number)


def recorded_tables(folder: Optional[Path] = None) -> List[Path]:
    """The recorded tables of a checkout (docs/data/*.csv that hold runs), or of `folder`."""
    if folder is None:
        folder = Path(__file__).resolve().parents[3] / "docs" / "data"
    if not Path(folder).is_dir():
        return []
    return [p for p in sorted(Path(folder).glob("*.csv")) if not p.stem.endswith("_curves")]


def records(paths: Iterable[Path]) -> pd.DataFrame:
    """Records (measures.RECORD_COLUMNS) of every path: a folder of run folders, a recorded table, or
    a folder of recorded tables (*.csv). For the same run and measure, a run folder wins over a
    table `stabexp claims --record` wrote, and that over a table of finished cells; among equals,
    the earlier path wins."""
    folders, recorded, cells = [], [], []
    for path in map(Path, paths):
        if path.is_file():
            tables = [path]
        elif path.is_dir() and any(path.glob("*.csv")) and not any(path.rglob("summary.json")):
            tables = recorded_tables(path)
        elif path.is_dir():
            folders.append(from_run_folders(path))
            continue
        else:
            raise FileNotFoundError(f"{path} is neither a folder of runs nor a recorded table")
        for table in tables:
            (recorded if "measure" in pd.read_csv(table, nrows=0).columns else cells).append(read_recorded(table))
    return merge([*folders, *recorded, *cells])


def evaluate_all(recorded: pd.DataFrame, claims: Optional[List[Claim]] = None) -> List[Result]:
    evidence = Evidence(wide(recorded))
    return [evaluate(claim, evidence) for claim in (claims or CLAIMS)]


COLUMNS = ("claim", "paper", "evidence", "measured", "verdict", "checks", "runs", "missing")


def markdown(results: List[Result], page: str = "", columns=COLUMNS) -> str:
    """The verdict table, one row per claim, with `columns` of: claim (linked to its section of
    `page`), paper, evidence (the scale and task, and the dates of the runs read), measured (with
    its spread over seeds), verdict, runs (how many finished runs of its cells it read), missing
    (what it lacks, the command that makes it and, where known, what that costs), checks (each
    regime check with its reading, and for one that stopped the verdict what meets it); then the
    count of each verdict."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        c = r.claim
        source = f"[{c.source}]({page}#{c.section})" if c.section else c.source
        missing = "-"
        if r.missing:
            missing = r.missing[0] + (f" (and {len(r.missing) - 1} more)" if len(r.missing) > 1 else "")
            missing += f"; `{c.command}`" + (f" ({c.cost})" if c.cost else "")
        evidence = c.evidence + (f"; runs of {r.dates}" if r.dates else "")
        checks = r.checks_text()
        remedies = [b.check.remedy for b in r.blocking if b.check.remedy]
        if remedies:
            checks += "; to meet: " + "; ".join(dict.fromkeys(remedies))
        cell = {"claim": f"{source}: {c.statement}", "paper": c.paper, "evidence": evidence,
                "measured": r.measured, "verdict": r.verdict_text(), "checks": checks, "runs": str(r.runs),
                "missing": missing}
        lines.append("| " + " | ".join(cell[k].replace("|", "\\|") for k in columns) + " |")
    counts = pd.Series([r.verdict for r in results]).value_counts()
    lines.append("")
    narrow = sum(bool(r.narrowly) for r in results)
    stopped = sum(bool(r.blocking) for r in results)
    lines.append(", ".join(f"{verdict}: {counts[verdict]}" for verdict in VERDICTS if verdict in counts)
                 + f" ({len(results)} claims; {stopped} not shown by a regime check, {narrow} narrowly).")
    revised = [r.claim for r in results if r.claim.revised]
    if "missing" in columns and revised:
        lines += ["", "Rules changed after they were written:"]
        lines += [f"- `{c.id}`: {c.revised}" for c in revised]
    return "\n".join(lines)


__all__ = ["CLAIMS", "Claim", "Evidence", "Result", "evaluate", "evaluate_all", "markdown", "records",
           "recorded_tables"]
