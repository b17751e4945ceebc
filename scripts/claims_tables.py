"""Write the verdict tables of the README ("What reproduces") and docs/results.md (its summary)
from the recorded runs (docs/data/), as `stabexp claims docs/data` judges them, and the line of
each results.md section that names the claims judged there (from the registry). Each table sits
between the two markers below; tests/test_docs.py fails when a page's table or a section's line
differs from this output, so neither a verdict nor a list of claims is typed by hand.

    python scripts/claims_tables.py          # rewrite both tables in place
    python scripts/claims_tables.py --check  # exit 1 when a page's table is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from stabexp import claims

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- stabexp claims: begin -->", "<!-- stabexp claims: end -->"
# (page, the link prefix of a claim's section from that page, the columns it shows)
PAGES = [(ROOT / "README.md", "docs/results.md", ("claim", "paper", "measured", "verdict")),
         (ROOT / "docs" / "results.md", "", claims.COLUMNS)]


RESULTS = ROOT / "docs" / "results.md"
JUDGED = "*Judged by rule, over the recorded runs: "


def tables():
    results = claims.evaluate_all(claims.records(claims.recorded_tables(ROOT / "docs" / "data")))
    return {page: claims.markdown(results, link, columns) for page, link, columns in PAGES}


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


def replaced(text: str, table: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv) -> int:
    stale = []
    for page, table in tables().items():
        text = page.read_text()
        new = replaced(text, table)
        if page == RESULTS:
            new = with_judged_lines(new)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if "--check" not in argv:
                page.write_text(new)
    if stale:
        print(("out of date: " if "--check" in argv else "rewrote: ") + ", ".join(map(str, stale)))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
