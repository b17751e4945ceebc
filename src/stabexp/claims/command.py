"""`stabexp claims [PATH ...] [--json] [--record FILE] [--only ID,...]`: every claim's verdict from
the runs on disk.

PATH is a folder of run folders (outputs/, a sweep folder) or a recorded table (docs/data/*.csv),
or a folder of recorded tables. With none: the run folders under the outputs folder, then the
checkout's recorded tables (docs/data/). `--record FILE` adds the finished runs of the PATH
folders to the recorded table FILE (their measures replace older ones of the same run) and then
judges from it and the recorded tables beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from stabexp.paths import outputs_dir
from stabexp.train.files import json_text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stabexp claims", description="Every claim's verdict, computed from the runs on disk.")
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                   help="folders of run folders or recorded tables (default: the outputs folder and docs/data/)")
    p.add_argument("--json", action="store_true", help="one JSON object per claim, in a list")
    p.add_argument("--record", type=Path, metavar="FILE",
                   help="add the finished runs under the PATH folders to this recorded table, then judge from it")
    p.add_argument("--only", metavar="ID,...", help="judge these claims only (ids as --json prints them)")
    return p


def main(argv: List[str]) -> int:
    from stabexp import claims
    from stabexp.claims.measures import write_recorded

    args = _parser().parse_args(argv)
    chosen = claims.CLAIMS
    if args.only:
        known = {c.id: c for c in claims.CLAIMS}
        wanted = [i.strip() for i in args.only.split(",") if i.strip()]
        unknown = [i for i in wanted if i not in known]
        if unknown:
            print(f"stabexp: error: --only {unknown[0]} is not a claim: choose from {', '.join(known)}", file=sys.stderr)
            return 2
        chosen = [known[i] for i in wanted]
    paths = args.paths or [outputs_dir(), *claims.recorded_tables()]
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        print(f"stabexp: error: {missing[0]} does not exist: give a folder of runs or a recorded table (.csv)",
              file=sys.stderr)
        return 2
    try:
        if args.record:
            runs = [p for p in paths if p.is_dir()]
            if not runs:
                print("stabexp: error: --record needs a folder of runs to record from", file=sys.stderr)
                return 2
            table = write_recorded(args.record, claims.records(runs))
            print(f"recorded {table.groupby(['recipe', 'group', 'depth', 'seed', 'setting'], dropna=False).ngroups} "
                  f"runs in {args.record}", file=sys.stderr)
            paths = [args.record, *(p for p in claims.recorded_tables(args.record.parent) if p != args.record)]
        found = claims.records(p for p in paths if p.exists())
    except (FileNotFoundError, ValueError) as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    results = claims.evaluate_all(found, chosen)
    if args.json:
        print(json_text([r.as_dict() for r in results], indent=1, ensure_ascii=False), end="")
    else:
        print(claims.markdown(results, page="docs/results.md"))
        quick = found[found.scale == "quick"] if "scale" in found else found.iloc[0:0]
        if len(quick):
            n = quick.groupby(["recipe", "group", "depth", "seed", "setting"], dropna=False).ngroups
            print(f"\n{n} runs at scale=quick ({', '.join(sorted(set(quick.recipe)))}), read by no claim: "
                  "a quick scale checks that a preset runs, it measures nothing a claim can rest on.")
    return 0
