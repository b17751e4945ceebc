"""What each experiment preset costs, from one place: its file's `# cost:` line.

A preset's cost is a wall time measured on a named machine (`3 min 17 s (2026-12-01, ...)`),
or, for a preset not yet timed in one piece, a figure marked `estimated` with what it is
estimated from. `stabexp list` prints the line, docs/presets.md's table shows the same text
(a docs test compares them), and the duration of `make reproduce` that the README and the
Makefile give is the sum of its presets' lines (`python -m stabexp.presets`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

COST = re.compile(r"^# cost: (.+)$", re.M)
# The duration the line starts with: `[about |estimated about ]1 h 55 min`, `3 min 17 s`, `39 s`.
DURATION = re.compile(r"^(?P<estimated>estimated )?(?:about )?(?:(?P<h>\d+) h)? ?(?:(?P<min>\d+) min)? ?(?:(?P<s>\d+) s)?")


@dataclass(frozen=True)
class Cost:
    text: str          # the line as written: the duration, then when, where and how it was measured
    seconds: float     # the duration it starts with
    estimated: bool    # True: not timed in one piece (the text says what it is estimated from)


def parse(text: str) -> Cost:
    match = DURATION.match(text)
    h, m, s = (int(match.group(k) or 0) for k in ("h", "min", "s"))
    if not (h or m or s):
        raise ValueError(f"a cost line must start with a duration such as `3 min 17 s` or `about 1 h 5 min`: {text!r}")
    return Cost(text, 3600 * h + 60 * m + s, bool(match.group("estimated")))


def line(path: Path) -> Optional[str]:
    """The text of the preset file's `# cost:` line, or None where it has none (a user's own preset)."""
    found = COST.search(Path(path).read_text())
    return found.group(1).strip() if found else None


def cost(path: Path) -> Optional[Cost]:
    """The preset file's cost (ValueError for a line that does not start with a duration)."""
    text = line(path)
    return parse(text) if text is not None else None


def total(paths: Iterable[Path]) -> Cost:
    """The presets' costs added up, `estimated` when any of them is."""
    paths = list(paths)
    costs = [cost(p) for p in paths]
    missing = [Path(p).stem for p, c in zip(paths, costs) if c is None]
    if missing:
        raise ValueError(f"no cost line in {', '.join(missing)}")
    seconds = sum(c.seconds for c in costs)
    estimated = sum(c.seconds for c in costs if c.estimated)
    return Cost(f"about {hours(seconds)} ({hours(estimated)} of it estimated)", seconds, estimated > 0)


def hours(seconds: float) -> str:
    """A duration rounded to the nearest hour past 5 h, to 10 minutes below."""
    minutes = seconds / 60
    if minutes >= 300:
        return f"{round(minutes / 60)} h"
    step = 10 if minutes >= 60 else 1
    h, m = divmod(int(round(minutes / step) * step), 60)
    return f"{h} h {m} min" if h and m else f"{h} h" if h else f"{m} min"


def reproduce_presets(makefile: Path) -> list:
    """The presets `make reproduce` runs, in its order (the Makefile's PRESETS)."""
    text = Path(makefile).read_text().replace("\\\n", " ")
    return re.search(r"^PRESETS := (.+)$", text, re.M).group(1).split()


if __name__ == "__main__":  # python -m stabexp.presets [REPO]: what make reproduce costs
    from stabexp.paths import conf_dir

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    names = reproduce_presets(root / "Makefile")
    paths = [conf_dir() / "experiment" / f"{n}.yaml" for n in names]
    for name, path in zip(names, paths):
        print(f"{name:<22} {cost(path).text}")
    print(f"make reproduce: {total(paths).text}")
