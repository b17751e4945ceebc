"""`make plots`: collect every run under outputs/ into outputs/collected/, then draw every figure
of the figures table (stabexp/plotting/table.py) into outputs/figures/NAME.png and .pdf.
Figures whose preset has no runs yet are named in one closing line, with the commands that make
them.

    python scripts/make_plots.py                  every figure
    python scripts/make_plots.py NAME [NAME ...]  those figures, a line each
    python scripts/make_plots.py --list           the figures, their presets and what they show
    python scripts/make_plots.py --markdown       the same as docs/presets.md's table
    python scripts/make_plots.py NAME --cells docs/data/deepnet_cells.csv
                                                  a figure drawn from cells, from the committed table
    --outputs DIR: another outputs folder (default: STABEXP_OUTPUTS, else ./outputs)
"""

import argparse
import sys
from pathlib import Path

from stabexp.paths import outputs_dir
from stabexp.plotting.collect import write_collected
from stabexp.plotting.table import FIGURES, draw_all, markdown


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="make_plots.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="figures to draw (default: all)")
    parser.add_argument("--outputs", type=Path, help="the outputs folder (default: STABEXP_OUTPUTS or ./outputs)")
    parser.add_argument("--cells", type=Path, metavar="TABLE", help="draw from this table of cells (docs/data)")
    parser.add_argument("--list", action="store_true", help="list the figures and stop")
    parser.add_argument("--markdown", action="store_true", help="the list as docs/presets.md's table")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(Path(__file__).resolve().parents[1] / "docs" / "figures"))
        return 0
    if args.list:
        for f in FIGURES.values():
            print(f"{f.name:30} {f.preset:24} {f.shows}")
        return 0
    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        parser.error(f"no figure {unknown[0]}: choose one of {', '.join(FIGURES)} (--list says what each shows)")
    if args.cells is not None:
        not_cells = [n for n in args.names or FIGURES if not FIGURES[n].recipe]
        if not args.names or not_cells:
            parser.error(f"--cells draws the figures drawn from cells: name one or more of "
                         f"{', '.join(n for n, f in FIGURES.items() if f.recipe)}")
        if not args.cells.is_file():
            parser.error(f"--cells {args.cells}: no such file")
    outputs = args.outputs or outputs_dir()
    if args.cells is None:
        print(f"collected the runs under {outputs} into {write_collected(outputs)}")
    outcomes = draw_all(outputs, args.names, args.cells)
    drawn = [o for o in outcomes if o.drawn]
    for o in outcomes:
        if o.drawn or args.names:
            print(o.line)
    if args.names:
        return 0
    line = f"drew {len(drawn)} figure{'' if len(drawn) == 1 else 's'} into {outputs / 'figures'}"
    missing = sorted({o.figure.preset for o in outcomes if not o.drawn})
    if missing:
        line += (f"; {len(missing)} preset{' has' if len(missing) == 1 else 's have'} no runs yet: "
                 f"{', '.join(missing)} (`stabexp run experiment=NAME`, or `make reproduce` for all)")
    print(line)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as err:  # a read-only or forbidden folder: one line, as the stabexp commands say it
        from stabexp.errors import cannot_write

        if cannot_write(err) is None:
            raise
        print(f"make_plots.py: error: {cannot_write(err)}", file=sys.stderr)
        sys.exit(1)
