"""`make plots`: collect every run under outputs/ into outputs/collected/, then run each figure
script (scripts/fig_*.py), which reads only those tables and writes outputs/figures/NAME.png/.pdf.
A figure whose preset has no runs yet is skipped with a line naming the preset."""

import runpy
import sys
from pathlib import Path

from stabexp.config import outputs_dir
from stabexp.plotting.collect import write_collected


def main() -> int:
    outputs = outputs_dir()
    collected = write_collected(outputs)
    print(f"collected the runs under {outputs} into {collected}")
    for script in sorted(Path(__file__).resolve().parent.glob("fig_*.py")):
        runpy.run_path(str(script))["main"]([str(outputs)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
