"""Write the verdict tables of the README ("What reproduces") and docs/results.md (its summary)
from the recorded runs (docs/data/), as `stabexp claims docs/data` judges them. Each table sits
between the two markers below; tests/test_docs.py fails when a page's table differs from this
output, so a verdict is never typed by hand.

    python scripts/claims_tables.py          # rewrite both tables in place
    python scripts/claims_tables.py --check  # exit 1 when a page's table is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from stabexp import claims

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- stabexp claims: begin -->", "<!-- stabexp claims: end -->"
# (page, the link prefix of a claim's section from that page, the columns it shows)
PAGES = [(ROOT / "README.md", "docs/results.md", ("claim", "paper", "measured", "verdict")),
         (ROOT / "docs" / "results.md", "", claims.COLUMNS)]


def tables():
    results = claims.evaluate_all(claims.records(claims.recorded_tables(ROOT / "docs" / "data")))
    return {page: claims.markdown(results, link, columns) for page, link, columns in PAGES}


def replaced(text: str, table: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv) -> int:
    stale = []
    for page, table in tables().items():
        text = page.read_text()
        new = replaced(text, table)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if "--check" not in argv:
                page.write_text(new)
    if stale:
        print(("out of date: " if "--check" in argv else "rewrote: ") + ", ".join(map(str, stale)))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
