"""Keep the finished runs of sweeps in a committed table (stabexp/cells.py):

    python scripts/record_cells.py docs/data/deepnet_cells.csv --recipe lm_depth SWEEP_DIR [SWEEP_DIR ...]

adds one row per finished run under each SWEEP_DIR (a cell measured again replaces its row) and
prints how many cells each recipe holds. `--recipe` names the settings the runs share (a
preset's name); runs of two presets with one recipe are the same runs."""

import argparse
import sys
from pathlib import Path

from stabexp import cells


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("--recipe", required=True, help="the settings the runs share, e.g. lm_depth")
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep (or run) folders")
    args = parser.parse_args(argv)
    missing = [str(s) for s in args.sweeps if not s.is_dir()]
    if missing:
        parser.exit(2, f"record_cells.py: error: no folder {', '.join(missing)}\n")
    frame = cells.record(args.table, args.sweeps, args.recipe)
    print(f"{args.table}: {len(frame)} cells\n{cells.describe(frame)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
