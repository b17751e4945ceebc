"""`stabexp run`, a Hydra app over conf/config.yaml: its front (`main`: the command line
checked before Hydra starts, stabexp.preflight; a sweep's folder named from the sweep; the jobs
that did not finish summed up), the task function Hydra calls for each run (each job of a sweep),
and what happens at Hydra's named moments (conf/config.yaml's hydra.callbacks).

Hydra composes the config, calls on_run_start (on_multirun_start for a sweep), and only then
makes the run's (the sweep's) folder and opens its log file there. RunFolder checks the folder in
between, on the path Hydra itself resolved: a folder that cannot be made, or a single run's
folder that another process holds, is one line and exit code 2 before anything is written (a
sweep skips a held job instead, in `task`).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from hydra.experimental.callback import Callback

from stabexp import distributed, unfinished
from stabexp.compose import sweeps
from stabexp.config import ConfigError, run_name
from stabexp.paths import conf_dir, outputs_dir
from stabexp.preflight import preflight
from stabexp.train.files import locked_message

log = logging.getLogger("stabexp")

# Hydra's own record of the command (.hydra/) is turned off and written by the task once the
# folder is known to be its run's (stabexp.train.folder.write_hydra_record); a command that
# names another hydra.output_subdir keeps Hydra's own.
RECORD_HYDRA = "hydra.output_subdir=null"


# From this many jobs on, the wait before the first one starts is said (a sweep of 1,000 seeds:
# three minutes here, in silence otherwise).
MANY_JOBS = 100


def main(args: List[str]) -> int:
    """`stabexp run ARGS`: the command line checked (stabexp.preflight), then the Hydra app."""
    if not distributed.launched():
        return _run(args)
    # torchrun, srun or submitit started K of us: one run on K processes (docs/scale.md). Every
    # rank checks the command and fetches the data it lacks before the process group forms (a
    # download or a tokenizer can take longer than a collective waits; each of their files is
    # written atomically, so ranks doing it at once are safe); the launcher's rank 0 prints.
    try:
        checked = preflight(args)
        if any("${now:" in h for h in checked.hydra_overrides):
            raise ConfigError("a run folder named by ${now:...} would differ between the processes of one "
                              "run: give hydra.run.dir (or hydra.sweep.dir) a fixed path")
    except ConfigError as err:
        if distributed.launcher_rank() == 0:
            print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    distributed.setup()
    try:
        return _run(args, checked)
    finally:
        distributed.teardown()


def _run(args: List[str], checked=None) -> int:
    try:
        checked = checked or preflight(args)
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    overrides, extra = [*checked.overrides, *checked.hydra_overrides], []
    multirun = checked.multirun and not checked.wants_help
    if multirun and checked.job_count >= MANY_JOBS and distributed.is_rank0():
        # The launcher composes every job's config (the packed launcher, all of a batch's) before
        # the first one starts.
        print(f"stabexp: {checked.job_count} jobs: Hydra composes the config of each before the first starts, "
              "a fraction of a second each", file=sys.stderr, flush=True)
    if checked.wants_help:
        # Hydra composes its help as one run, where a sweep is an error: the config without the swept keys.
        swept = sweeps(checked.overrides)
        overrides = [o for o in overrides if o not in swept]
    if multirun and not any(h.startswith("hydra.sweep.dir=") for h in checked.hydra_overrides):
        # One sweep folder named from the whole sweep, so re-running it finds its jobs again.
        extra.append(f"hydra.sweep.dir='{outputs_dir() / 'multirun' / run_name(checked.overrides)}'")
    if not any(h.lstrip("+").startswith("hydra.output_subdir=") for h in checked.hydra_overrides):
        extra.append(RECORD_HYDRA)
    if multirun and distributed.launched() and not any(h.startswith(("hydra/launcher=", "hydra.launcher."))
                                                      for h in checked.hydra_overrides):
        # K processes run one run at a time together: the sweep goes one job after another.
        extra.append("hydra/launcher=basic")
    scratch = None
    if not distributed.is_rank0():
        # Hydra's own files (.hydra/, the log file, a sweep's multirun.yaml) come from rank 0:
        # the other ranks log to the terminal and keep a sweep's bookkeeping in a temp folder.
        extra.append("hydra/job_logging=stdout")
        if multirun:
            scratch = tempfile.mkdtemp(prefix="stabexp-rank")
            overrides = [o for o in overrides if not o.startswith("hydra.sweep.dir=")]
            extra = [e for e in extra if not e.startswith("hydra.sweep.dir=")] + [f"hydra.sweep.dir='{scratch}'"]
    # Hydra's parser takes the overrides as one list, so they go before every flag (and a flag
    # whose value is optional, `--info`, is not handed an override as its value).
    sys.argv = ["stabexp", *overrides, *extra, *checked.flags]
    unfinished.JOBS.clear()
    try:
        hydra_app()()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if unfinished.JOBS and distributed.is_rank0():
        print(f"stabexp: error: {len(unfinished.JOBS)} job(s) of the sweep did not finish (the others ran):",
              file=sys.stderr)
        for out_dir, why in unfinished.JOBS:
            print(f"  {out_dir}: {why}", file=sys.stderr)
        return 1
    return 0


def _job_ended(out_dir: Path, why: str, hydra_cfg, err: Optional[BaseException] = None) -> None:
    """A sweep's job that did not finish: one line now, a line in the sum at the end (the packed
    launcher carries it back from the job's process), and on Hydra's launchers that run jobs in
    other processes (joblib, submitit) the error raised for it to report, which it does once
    every job has run."""
    log.error("job %s %s", out_dir.name, why, exc_info=err)  # the traceback: terminal and the job's log
    unfinished.JOBS.append((out_dir, why))
    if not any(name in str(hydra_cfg.launcher.get("_target_", "")) for name in ("BasicLauncher", "PackedLauncher")):
        raise RuntimeError(f"{out_dir}: {why}") from err


def task(cfg) -> None:
    """Hydra's task function: one job (of a sweep) or one run, in this process or in a packed
    sweep's job process (stabexp.sweep), which is why it lives at module level (picklable)."""
    from hydra.core.hydra_config import HydraConfig

    from stabexp.train import folder
    from stabexp.train.files import RunLocked
    from stabexp.train.stop import RunStopped
    from stabexp.train.trainer import train

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    if distributed.launched():
        distributed.setup()  # the K tasks of a submitit job enter here, not through main
        out_dir = distributed.broadcast(out_dir)  # one folder for all ranks: rank 0's
        if not distributed.is_rank0():
            logging.getLogger("stabexp").setLevel(logging.WARNING)
            # Under submitit every task has Hydra's log file open: rank 0's alone writes it.
            for handler in [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]:
                logging.getLogger().removeHandler(handler)
                handler.close()
    say = print if distributed.is_rank0() else (lambda *a, **k: None)  # one line, from rank 0
    hydra_cfg = HydraConfig.get()
    in_sweep = str(hydra_cfg.mode) in ("MULTIRUN", "RunMode.MULTIRUN")
    # Hydra's record of the command (.hydra/), once the folder is known to be this run's.
    record = (lambda: folder.write_hydra_record(out_dir, cfg)) if hydra_cfg.output_subdir is None else None
    try:
        summary = train(cfg, out_dir, on_start=record)
    except ConfigError as err:
        if in_sweep:  # one job refused: said, and the sweep goes on (main sums up at the end)
            _job_ended(out_dir, f"refused: {err}", hydra_cfg)
            return
        say(f"stabexp: error: {err}", file=sys.stderr)
        _remove_if_only_an_empty_log(out_dir)
        sys.exit(2)
    except RunLocked as err:
        if in_sweep:
            # Another process runs this job (two launches of one sweep share the work).
            log.warning("skipped: %s", err)
            return
        say(f"stabexp: error: {err}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as stop:
        say(f"stabexp: stopped by {stop}: {out_dir} has a checkpoint; the same command resumes it",
            file=sys.stderr)
        sys.exit(128 + stop.signum)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            _failed(err, out_dir, hydra_cfg, in_sweep)
            return
        # A full disk is the machine's state, not a fault of the code: one line, no traceback. The
        # run is recorded "failed" where it could be, and its last checkpoint stays.
        why = f"the disk is full: {err.strerror or err}; free space and the same command resumes the run"
        if in_sweep and distributed.world() == 1:
            _job_ended(out_dir, f"failed: {why}", hydra_cfg)
            return
        say(f"stabexp: error: {why}", file=sys.stderr)
        sys.exit(1)
    except Exception as err:
        _failed(err, out_dir, hydra_cfg, in_sweep)
        return
    eval_loss, bleu = summary.get("final_eval_loss"), summary.get("test_bleu")
    log.info("%s: %s after %s steps, eval loss %s%s, results in %s", summary["group"],
             summary["status"], summary.get("steps_done"),
             f"{eval_loss:.4f}" if eval_loss is not None else "n/a",
             f", test BLEU {bleu:.2f}" if bleu is not None else "", out_dir)


def _remove_if_only_an_empty_log(out_dir: Path) -> None:
    """A run refused before it touched its folder leaves none: Hydra made the folder and its empty
    stabexp.log before the run's checks; a folder holding anything else is left as it is."""
    log_file = out_dir / "stabexp.log"
    try:
        if [p.name for p in out_dir.iterdir()] != [log_file.name] or log_file.stat().st_size:
            return
        for handler in [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)
                        and Path(h.baseFilename) == log_file.resolve()]:
            logging.getLogger().removeHandler(handler)
            handler.close()
        log_file.unlink()
        out_dir.rmdir()
    except OSError:  # gone already, or not ours to remove: nothing to tidy
        return


def _failed(err: Exception, out_dir: Path, hydra_cfg, in_sweep: bool) -> None:
    """An error the run did not expect: raised for one run (and on K processes, which stop
    together: torchrun ends them); one job of a sweep ends and the sweep goes on."""
    if not in_sweep or distributed.world() > 1:
        raise err
    _job_ended(out_dir, f"failed: {type(err).__name__}: {err}", hydra_cfg, err)


def hydra_app():
    """The Hydra app: `hydra_app()()` runs it on sys.argv."""
    import hydra
    from hydra.core.plugins import Plugins

    from hydra_plugins.stabexp_launcher.checked_sweeper import CheckedBasicSweeper
    from hydra_plugins.stabexp_launcher.packed_launcher import PackedLauncher

    # Hydra finds launchers and sweepers by scanning the hydra_plugins folders, which misses an
    # editable install's (a path hook, not a folder): registered by hand, as Hydra's API allows.
    Plugins.instance().register(PackedLauncher)
    Plugins.instance().register(CheckedBasicSweeper)
    return hydra.main(version_base=None, config_path=str(conf_dir()), config_name="config")(task)


class RunFolder(Callback):
    """The run's (sweep's) folder is made before Hydra writes into it, or the command stops."""

    def on_run_start(self, config, **kwargs) -> None:
        _check(config.hydra.run.dir, "hydra.run.dir", "run folder", single_run=True)

    def on_multirun_start(self, config, **kwargs) -> None:
        _check(config.hydra.sweep.dir, "hydra.sweep.dir", "sweep folder", single_run=False)


def _check(path, key: str, what: str, single_run: bool) -> None:
    error = None
    if distributed.is_rank0():  # one process makes and reads the folder; all stop together
        try:
            error = _problem(str(path), key, what, single_run)
        except ConfigError as err:
            error = str(err)
    error = distributed.broadcast(error)
    if error is not None:
        if distributed.is_rank0():
            print(f"stabexp: error: {error}", file=sys.stderr)
        sys.exit(2)


def _problem(path: str, key: str, what: str, single_run: bool):
    if not path.strip():  # Hydra would write the run into the current folder
        return (f"{key}= is empty: give the {what}'s path (or leave it out for one under the "
                "outputs folder)")
    make_folder(Path(path), what)
    return locked_message(Path(path)) if single_run else None


def make_folder(path: Path, what: str = "run folder") -> None:
    """Create `path` (and its parents) now, so that a folder that cannot be made (no such
    device, no permission, a read-only or full disk) is one line, not Hydra's traceback."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the {what} {path}: {err.strerror or err}") from None
    # One that is there but cannot be written (a read-only disk or mount, no permission): the
    # run's files, the sweep's multirun.yaml, a checkpoint would each fail later as a traceback.
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write in the {what} {path}: it is read-only here; give a folder you can "
                          "write (STABEXP_OUTPUTS, hydra.run.dir or hydra.sweep.dir)")
