"""Write the verdict tables of the README ("What reproduces") and docs/results.md (its summary)
from the recorded runs (docs/data/), as `stabexp claims docs/data` judges them, the line of each
results.md section that names the claims judged there (from the registry), and results.md's
table of the verdicts before and after the regime checks (against the verdicts recorded in
docs/data/verdicts_acae9c5.json). Each table sits between its two markers; tests/test_docs.py
fails when a page's table or a section's line differs from this output, so neither a verdict nor
a list of claims is typed by hand.

    python scripts/claims_tables.py          # rewrite both tables in place
    python scripts/claims_tables.py --check  # exit 1 when a page's table is out of date
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from stabexp import claims
from stabexp.claims.registry import NOT_SHOWN

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- stabexp claims: begin -->", "<!-- stabexp claims: end -->"
# (page, the link prefix of a claim's section from that page, the columns it shows)
PAGES = [(ROOT / "README.md", "docs/results.md", ("claim", "paper", "measured", "verdict")),
         (ROOT / "docs" / "results.md", "", claims.COLUMNS)]


RESULTS = ROOT / "docs" / "results.md"
JUDGED = "*Judged by rule, over the recorded runs: "


BEFORE = ROOT / "docs" / "data" / "verdicts_acae9c5.json"
CHANGES_BEGIN, CHANGES_END = "<!-- verdicts before and after: begin -->", "<!-- verdicts before and after: end -->"
REVISED_ON = "2026-12-07"  # the day the regime checks came in: a rule revised then is named as a cause


def results():
    return claims.evaluate_all(claims.records(claims.recorded_tables(ROOT / "docs" / "data")))


def tables(judged=None):
    judged = judged or results()
    return {page: claims.markdown(judged, link, columns) for page, link, columns in PAGES}


def short(verdict: str) -> str:
    return verdict.replace(" at this scale", "")


def before_and_after(judged) -> str:
    """Every verdict that moved since the recorded verdicts of BEFORE, or that a check stopped, a
    seed moves, a rule revised on REVISED_ON or runs added since: what it was, what it is, the
    rule's verdict alone and what moved it; then what each check moved, from which verdict."""
    before = json.loads(BEFORE.read_text())
    old = before["verdicts"]
    rows, moved_by = [], Counter()
    for r in judged:
        c = r.claim
        causes = []
        if c.id not in old:
            causes.append("a new row")
        if REVISED_ON in c.revised:
            causes.append("rule revised (its entry under the verdict table)")
        if c.id in old and before["runs"][c.id] != r.runs:
            causes.append(f"{r.runs} runs read, {before['runs'][c.id]} before")
        causes += [f"{b.check.name}: not {'met' if b.met is False else 'measured'}" for b in r.blocking]
        if r.narrowly:
            causes.append(f"narrowly: {r.narrowly}")
        for b in r.blocking:
            moved_by[(b.check.name, short(r.rule_verdict))] += 1
        if old.get(c.id) == r.verdict and not causes:
            continue
        rule_alone = short(r.rule_verdict) if r.blocking else "-"
        rows.append(f"| `{c.id}` | {short(old.get(c.id, '-'))} | {short(r.verdict)} | {rule_alone} | "
                    + "; ".join(causes or ["-"]).replace("|", "\\|") + " |")

    def counts(verdicts):
        found = Counter(verdicts)
        return ", ".join(f"{v} {found[v]}" for v in claims.VERDICTS if found[v])
    stopped = sum(bool(r.blocking) for r in judged)
    checks = sorted({name for name, _ in moved_by})
    by_check = "; ".join(
        f"{name} {sum(n for (k, _), n in moved_by.items() if k == name)} ("
        + ", ".join(f"{n} from {v}" for (k, v), n in sorted(moved_by.items()) if k == name) + ")" for name in checks)
    return "\n".join([
        f"**Every verdict that moved, before and after** (before: `stabexp claims docs/data` at commit {before['commit']}, "
        f"{len(old)} claims, recorded in [data/{BEFORE.name}](data/{BEFORE.name}); after: the same command on the runs "
        f"recorded in data/, {len(judged)} claims; both on this project's 2-core CPU). \"The rule alone\" is what the claim's "
        "rule says before its checks, where a check stopped it; the old rules are in the history of "
        "`src/stabexp/claims/`. Claims not listed kept their verdict and read the same runs, and no check stopped them.",
        "",
        "| claim | before | after | the rule alone | what moved it |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Counts: before, {counts(old.values())}; after, {counts(r.verdict for r in judged)} "
        f"({stopped} of the \"not shown\" by a check; {sum(bool(r.narrowly) for r in judged)} verdicts narrowly). "
        f"What each check moved to \"{NOT_SHOWN}\", from the rule's own verdict (a claim two checks stopped "
        f"counts under each): {by_check}. A check only stops a "
        "verdict: none moved one the other way, and a verdict that rose did so by its revised rule.",
    ])


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def judged_line(ids) -> str:
    names = ", ".join(f"`{i}`" for i in ids)
    return f"{JUDGED}{names} in [the verdicts](#the-verdicts) (`stabexp claims --only {','.join(ids)}`).*"


def with_judged_lines(text: str) -> str:
    """results.md with the first "Judged by rule" line of each numbered section naming the claims
    whose section it is, in the registry's order."""
    by_section = {}
    for c in claims.CLAIMS:
        by_section.setdefault(c.section, []).append(c.id)
    parts = re.split(r"(?m)^(## \d+\. .*)$", text)
    out = [parts[0]]
    for heading, body in zip(parts[1::2], parts[2::2]):
        ids = by_section.get(anchor(heading[3:]))
        if ids:
            body = re.sub(r"(?m)^" + re.escape(JUDGED) + r".*$", lambda _: judged_line(ids), body, count=1)
        out += [heading, body]
    return "".join(out)


def replaced(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def results_page(text: str, judged) -> str:
    """results.md with its judged lines and its table of verdicts before and after brought up to date."""
    return replaced(with_judged_lines(text), before_and_after(judged), CHANGES_BEGIN, CHANGES_END)


def main(argv) -> int:
    stale = []
    judged = results()
    for page, table in tables(judged).items():
        text = page.read_text()
        new = replaced(text, table)
        if page == RESULTS:
            new = results_page(new, judged)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if "--check" not in argv:
                page.write_text(new)
    if stale:
        print(("out of date: " if "--check" in argv else "rewrote: ") + ", ".join(map(str, stale)))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
