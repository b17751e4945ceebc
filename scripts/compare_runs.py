"""Compare two trees of run folders file by file: `python scripts/compare_runs.py BEFORE AFTER`.

For a change that must not move a recorded number (a refactor of the model, the probes or the
trainer): run the same commands with the code before and after it, every probe on, into two
folders, e.g.

    stabexp run group=admin depth=3 model.dropout=0.1 probe.at_init=true probe.weights=true \
        probe.every=1 train.steps=12 hydra.run.dir=BEFORE/admin

and compare. metrics.csv and layers.csv are compared as text, cell by cell (so bit for bit),
without the wall-clock column; summary.json without its wall-clock fields and folder; every
other file byte for byte. Prints each difference and exits 1 when there is one.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from stabexp.train.files import WALL_CLOCK as WALL
SKIP = ("run.lock", "stabexp.log", "error.txt")


def _rows(path: Path):
    rows = list(csv.reader(path.open()))
    keep = [i for i, column in enumerate(rows[0]) if column not in WALL] if rows else []
    return [[row[i] for i in keep] for row in rows]


def _summary(path: Path):
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if k not in WALL}


def same(a: Path, b: Path) -> bool:
    if a.suffix == ".csv":
        return _rows(a) == _rows(b)
    if a.name == "summary.json":
        return _summary(a) == _summary(b)
    return a.read_bytes() == b.read_bytes()


def differences(before: Path, after: Path):
    """(relative path, what differs) for every file of a run folder under either tree."""
    runs = sorted({p.parent.relative_to(root) for root in (before, after) for p in root.rglob("summary.json")})
    for run in runs:
        names = {p.name for root in (before, after) for p in (root / run).glob("*")
                 if p.is_file() and p.name not in SKIP}
        for name in sorted(names):
            a, b = before / run / name, after / run / name
            if not (a.exists() and b.exists()):
                yield str(run / name), f"only in {before if a.exists() else after}"
            elif not same(a, b):
                yield str(run / name), "differs"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python scripts/compare_runs.py BEFORE AFTER", file=sys.stderr)
        return 2
    before, after = map(Path, argv)
    found = list(differences(before, after))
    for path, what in found:
        print(f"{path}: {what}")
    runs = len({p.parent.relative_to(root) for root in (before, after) for p in root.rglob("summary.json")})
    print(f"{runs} runs compared, {len(found)} files differ")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
