"""`make plots`: collect every run under outputs/ into outputs/collected/, then run each figure
script (scripts/fig_*.py), which reads only those tables and writes outputs/figures/NAME.png/.pdf.
Figures whose preset has no runs yet are named in one closing line, with the commands that make
them."""

import runpy
import sys
from pathlib import Path

from stabexp.paths import outputs_dir
from stabexp.plotting import figures
from stabexp.plotting.collect import write_collected


def main() -> int:
    outputs = outputs_dir()
    collected = write_collected(outputs)
    print(f"collected the runs under {outputs} into {collected}")
    figures.outcomes = []
    try:
        for script in sorted(Path(__file__).resolve().parent.glob("fig_*.py")):
            runpy.run_path(str(script))["main"]([str(outputs)])
        drawn = [name for name, _, ok in figures.outcomes if ok]
        missing = sorted({preset for _, preset, ok in figures.outcomes if not ok})
    finally:
        figures.outcomes = None
    line = f"drew {len(drawn)} figure{'' if len(drawn) == 1 else 's'} into {outputs / 'figures'}"
    if missing:
        line += (f"; {len(missing)} preset{' has' if len(missing) == 1 else 's have'} no runs yet: "
                 f"{', '.join(missing)} (`stabexp run experiment=NAME`, or `make reproduce` for all)")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
