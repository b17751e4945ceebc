"""`stabexp export-tensorboard SWEEP_DIR [--logdir DIR]`: run folders already on disk as
TensorBoard event files, so that sweeps run without `logger=tensorboard` can be browsed too.

Each run folder under SWEEP_DIR (any depth) goes through the same TensorBoard tracker a live run
uses, fed from its files: metrics.csv and layers.csv row by row, config.yaml and summary.json's
constants as hyper-parameters, summary.json's fields and the run's figures at the end. The event
files land where a live run's would, `tensorboard/<run folder name>/` beside the run folder, or
under DIR with the run's path below SWEEP_DIR. Exporting again hides the earlier export (a run
start purges what its folder held), so the same command can be repeated as a sweep grows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Dict, List, Optional

from stabexp.errors import install_hint

USAGE = """usage: stabexp export-tensorboard SWEEP_DIR [--logdir DIR]
  every run folder under SWEEP_DIR as TensorBoard event files: SWEEP_DIR/tensorboard/<run>/ beside
  the run folders (or DIR/<run's path under SWEEP_DIR>/); then: tensorboard --logdir SWEEP_DIR/tensorboard"""


def numbers(row: Dict[str, str]) -> Dict[str, object]:
    """A CSV row with its numeric cells as floats (the step as an int), empty cells left out."""
    out: Dict[str, object] = {}
    for key, text in row.items():
        if text in ("", None):
            continue
        try:
            out[key] = int(text) if key in ("step", "layer") else float(text)
        except ValueError:
            out[key] = text
    return out


def export_run(run: Path, logdir: Optional[Path]) -> Path:
    """One run folder as event files; returns the folder written."""
    from omegaconf import OmegaConf

    from stabexp.config import LoggerConfig, TensorBoardLogger, with_defaults
    from stabexp.tracking import RunInfo, Trackers
    from stabexp.tracking.backends import TensorBoard
    from stabexp.train.files import read_csv_rows, read_json

    cfg = with_defaults(OmegaConf.load(run / "config.yaml"))
    cfg.logger = OmegaConf.structured(LoggerConfig(tensorboard=TensorBoardLogger(dir=str(logdir) if logdir else None)))
    summary = read_json(run / "summary.json")
    backend = TensorBoard(RunInfo(cfg, run, None), cfg.logger.tensorboard)
    trackers = Trackers([backend])
    trackers.start(summary)
    trackers.metrics_rows([numbers(r) for r in read_csv_rows(run / "metrics.csv")])
    layers = [numbers(r) for r in read_csv_rows(run / "layers.csv")]
    for step in sorted({r["step"] for r in layers}):  # a step at a time, as a run writes them
        trackers.layers_rows([r for r in layers if r["step"] == step])
    trackers.finish(summary, run)
    return backend.logdir / run.name


def main(argv: List[str]) -> int:
    from stabexp.train.files import find_runs, is_locked

    args = list(argv)
    logdir = None
    if "--logdir" in args:
        i = args.index("--logdir")
        if i + 1 >= len(args):
            print("stabexp: error: --logdir needs a folder", file=sys.stderr)
            return 2
        logdir = Path(args[i + 1])
        del args[i:i + 2]
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    sweep = Path(args[0])
    if not sweep.is_dir():
        print(f"stabexp: error: {sweep} is not a folder: pass a sweep folder (or a run folder) made by stabexp run",
              file=sys.stderr)
        return 2
    if importlib.util.find_spec("tensorboard") is None:
        print("stabexp: error: export-tensorboard needs the tensorboard package, which is not installed: "
              f"{install_hint('tensorboard')}", file=sys.stderr)
        return 2
    runs = [r for r in find_runs(sweep) if (r / "config.yaml").is_file() and "tensorboard" not in r.parts]
    if not runs:
        print(f"stabexp: error: {sweep} holds no run folder (a folder with summary.json and config.yaml)",
              file=sys.stderr)
        return 2
    written = []
    for run in runs:
        if is_locked(run):
            print(f"skipped {run}: a process is running it (it logs live with logger=tensorboard)")
            continue
        target = logdir / run.relative_to(sweep).parent if logdir is not None and run != sweep else logdir
        written.append(export_run(run, target))
    roots = sorted({str(w.parent) for w in written})
    browse = roots[0] if len(roots) == 1 else str(logdir or sweep)  # TensorBoard looks in sub-folders
    print(f"wrote {len(written)} run folder(s) as TensorBoard event files under {', '.join(roots)}; "
          f"browse them with: tensorboard --logdir {browse}")
    return 0
