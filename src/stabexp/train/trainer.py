"""train(cfg, out_dir): one run, start to finish, writing its tidy files into out_dir.

Read top to bottom: `train` decides what happens to the folder (skip a finished run, resume an
unfinished one, start a new one) and records how the run ended; `run_steps` is the loop. What a
step does is `Run.step` (train/run.py); what a probe step writes, train/recording.py; the files
themselves, train/files.py and train/checkpoint.py. The trainer asks the task (data/) for
batches, the loss and the eval columns, and the model for its outputs and residual sublayers;
it knows neither's insides. docs/outputs.md describes every file and column.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from stabexp import distributed, memory, plugins
from stabexp.config import ConfigError, resolved, validate, validate_world
from stabexp.data import Task, make_task
from stabexp.train import checkpoint, folder
from stabexp.atomic import remove_partials, write_atomic
from stabexp.train.files import SUMMARY, RunLock, RunLocked, read_summary, summary_file_problem, write_json
from stabexp.train.recording import group_name
from stabexp.train.build import check_parallel, device_of
from stabexp.train.run import Run
from stabexp.train.stop import RunStopped, StopRequests
from stabexp import tracking
from stabexp.tracking import Trackers

log = logging.getLogger("stabexp")

FINISHED = ("completed", "diverged")
ERROR = "error.txt"  # the traceback of a failed run


def train(cfg: DictConfig, out_dir, on_start: Optional[Callable[[], None]] = None) -> Dict:
    """Run one experiment; return its summary (also written to out_dir/summary.json).

    A folder holding a run of another config is refused (ConfigError naming the keys that
    differ; stabexp.train.folder) unless cfg.overwrite is set, which replaces that run. A run
    that is already finished in out_dir is left untouched unless cfg.overwrite is set; an
    unfinished one with a checkpoint is resumed from it. The task is built first, so bad data
    (a ConfigError) stops the run before anything is written. One process per folder: a second
    one raises RunLocked. A diverged run is a result (status "diverged"); a run asked to stop
    checkpoints and raises RunStopped; an unexpected error is recorded as status "failed" and
    re-raised (its last checkpoint stays, so the same command resumes it).

    `on_start` is called (on rank 0) once the config is valid, the folder is this run's and its
    lock held, before the run's first file: `stabexp run` writes Hydra's record of the command.

    On K processes (stabexp.distributed) every rank calls it; rank 0 reads the folder, holds
    the lock and writes, and the others follow its decisions.
    """
    check(cfg)
    out_dir = Path(out_dir)
    done = distributed.broadcast(_finished(out_dir, cfg) if distributed.is_rank0() else None)
    if isinstance(done, str):
        raise ConfigError(done)
    if done:
        return done
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    task = make_task(cfg, device_of(cfg.train.device))
    check_parallel(cfg, task)
    lock = RunLock(out_dir)
    claim = distributed.broadcast(_claim(lock, out_dir, cfg) if distributed.is_rank0() else None)
    if isinstance(claim, str):
        raise RunLocked(claim)
    if "refused" in claim:
        raise ConfigError(claim["refused"])
    try:
        if claim:  # finished by the process that held the lock before us
            return claim
        if cfg.overwrite:
            checkpoint.remove(out_dir)
            if distributed.is_rank0():
                folder.clear(out_dir)
        if on_start is not None and distributed.is_rank0():
            on_start()
        distributed.barrier()
        state = checkpoint.load(out_dir, cfg)
        summary = _new_summary(cfg, out_dir) if state is None else _resumed_summary(state, out_dir)
        # TensorBoard, MLflow, W&B (logger=...): they see the rows as written, and the end.
        trackers = Trackers.open(cfg, out_dir, state)
        start = time.perf_counter()
        try:
            summary.update(run_steps(cfg, out_dir, summary, start, task, state, trackers))
        except (KeyboardInterrupt, RunStopped):
            summary.update(status="interrupted", wall_seconds=summary.get("wall_seconds") or
                           time.perf_counter() - start)
            write_json(out_dir / SUMMARY, summary)
            raise
        except Exception as err:
            summary.update(status="failed", error=f"{type(err).__name__}: {err}",
                           wall_seconds=time.perf_counter() - start)
            try:  # the error itself may be a full disk: record what can be, raise the original
                if distributed.is_rank0():
                    write_atomic(out_dir / ERROR, lambda f: f.write(traceback.format_exc().encode()))
                write_json(out_dir / SUMMARY, summary)
            except OSError as cannot_record:
                log.error("could not record the failure in %s: %s", out_dir, cannot_record)
            raise
        finally:
            trackers.finish(summary, out_dir)
        write_json(out_dir / SUMMARY, summary)
        if distributed.is_rank0():
            (out_dir / ERROR).unlink(missing_ok=True)  # of an earlier attempt: this one finished
        distributed.barrier()
        checkpoint.remove(out_dir)
        return summary
    finally:
        lock.release()


def check(cfg: DictConfig) -> None:
    """What must hold before a run touches its folder (ConfigError): a valid config for this
    many processes, its trackers, a batch that can fit in the memory here. On K processes
    every rank checks (the memory is each one's own) and all raise the first rank's refusal,
    so that they go on, or stop, together."""
    try:
        check_config(cfg, distributed.world(), distributed.active())
        memory.check_fits(cfg, device_of(cfg.train.device), distributed.world())
        refusal = None
    except ConfigError as err:
        refusal = str(err)
    refusals = [r for r in distributed.gather(refusal) if r]
    if refusals:
        raise ConfigError(refusals[0])


def check_config(cfg: DictConfig, world: int, grouped: bool) -> None:
    """The config's own rules, each component's (config.validate), those of running on `world`
    processes, of the step hooks it turns on and of its trackers: what `stabexp run` checks for
    every cell of a sweep before any job starts (stabexp.preflight) and a run before it starts."""
    validate(cfg)
    validate_world(cfg, world, grouped)
    for hook in plugins.step_hooks(cfg):
        hook.check(cfg)
    tracking.check(cfg)


def run_steps(cfg: DictConfig, out_dir: Path, summary: Dict, start: float, task: Task,
              state: Optional[Dict] = None, trackers: Optional[Trackers] = None) -> Dict:
    """A Run through its steps (`steps`, the loop), then what the probes and the task measure
    at the end of a completed run."""
    # The peak of this run, not of earlier jobs of a sweep; and what the process held before
    # the model was built (a run's own memory is the peak less that).
    before = distributed.gather(memory.reset(device_of(cfg.train.device)))
    run = Run(cfg, out_dir, summary, start, task, state=state, trackers=trackers)
    try:
        steps(run, cfg, out_dir, summary)
        wall = time.perf_counter() - run.start
        peaks = distributed.gather(memory.peak_mib(run.device))  # every rank's, on K processes
        run.result.update(steps_done=run.steps_done, wall_seconds=wall,
                          steps_per_second=run.steps_done / wall if wall > 0 else None,
                          peak_memory_mib=peaks[0], memory_before_model_mib=before[0],
                          target_tokens=task.target_tokens,
                          **({"peak_memory_mib_ranks": peaks, "memory_before_model_mib_ranks": before}
                             if len(peaks) > 1 else {}))
        for key in ("checkpoint_step", "interrupted_by"):
            summary.pop(key, None)
        if run.result["status"] == "completed" and run.steps_done > 0:
            run.write_final()
            finish_start = time.perf_counter()
            with distributed.full_weights(run.model):
                final = task.finish(run.model, out_dir)
            if final:  # e.g. the test decoding, timed apart from the training
                run.result.update(final, finish_seconds=time.perf_counter() - finish_start)
    finally:
        run.close()
    return run.result


def steps(run: Run, cfg: DictConfig, out_dir: Path, summary: Dict) -> None:
    """The steps left, and the hooks' moments between them (train/hooks.py): after each step
    (a checkpoint every train.checkpoint_every steps), when the process is asked to stop (a
    checkpoint, then RunStopped once the signal is passed on) and at the end."""
    with StopRequests() as stop:
        for step in range(run.steps_done + 1, cfg.train.steps + 1):
            if not run.step(step):
                break
            # Every rank stops after the same step: the signal any of them received (a collective).
            signum = distributed.agreed_signal(stop.received)
            if signum is not None:
                if run.on_stop_request():  # it diverged before: a result, not a stop
                    break
                summary.update(status="interrupted", interrupted_by=signal.Signals(signum).name,
                               wall_seconds=time.perf_counter() - run.start)
                write_json(Path(out_dir) / SUMMARY, summary)
                log.warning("stopped by %s after step %d: checkpoint written, the same command resumes it",
                            signal.Signals(signum).name, step)
                stop.pass_on(signum)
            run.after_step(step)
        run.at_end()


def _finished(out_dir: Path, cfg: DictConfig):
    """The summary of the folder's finished run of this config (None: none, or overwrite), or
    the one line refusing a folder that holds a run of another config."""
    refused = folder.refused(out_dir, cfg) or _unreadable_summary(out_dir, cfg)
    if refused:
        return refused
    previous = finished(out_dir, cfg)
    if previous:
        log.info("already %s, left as is: %s (overwrite=true runs it again)", previous["status"], out_dir)
    return previous


def finished(out_dir: Path, cfg: DictConfig) -> Optional[Dict]:
    """The summary of the folder's finished run, which this one leaves as it is; None when it
    has none (or overwrite replaces it)."""
    previous = read_summary(out_dir)
    return previous if previous and previous.get("status") in FINISHED and not cfg.overwrite else None


def _unreadable_summary(out_dir: Path, cfg: DictConfig) -> Optional[str]:
    """The one line refusing a folder whose summary.json is not a run's: what it holds is not
    this run's to replace, unless overwrite says so (a folder or a FIFO in its place, never)."""
    path = out_dir / SUMMARY
    problem = summary_file_problem(path) if os.path.lexists(path) else None
    if problem is None or (cfg.overwrite and path.is_file()):
        return None
    fix = "overwrite=true replaces it" if path.is_file() else "remove it, or give this run another folder"
    return f"{path} is not a run's summary ({problem}): {fix}"


def _claim(lock: RunLock, out_dir: Path, cfg: DictConfig):
    """Rank 0 takes the folder's lock: the message of the process that holds it (a str), the
    summary of a run finished meanwhile, {"refused": why} for a run of another config started
    meanwhile, or {} to go on."""
    try:
        lock.acquire()
    except RunLocked as err:
        return str(err)
    done = _finished(out_dir, cfg)
    if isinstance(done, str):  # another config's run, started meanwhile
        lock.release()
        return {"refused": done}
    if done:
        return done
    remove_partials(out_dir)  # temp files of writers killed mid-write: the folder is ours now
    if lock.previous_holder:
        log.warning("took over the lock of %s, which is no longer running", lock.previous_holder)
    return {}


def _new_summary(cfg: DictConfig, out_dir: Path) -> Dict:
    if distributed.is_rank0():
        # Without the trackers: where a run is watched is not what it ran (the same file either way).
        text = OmegaConf.to_yaml(OmegaConf.create(resolved(cfg))).encode()
        write_atomic(out_dir / folder.CONFIG, lambda f: f.write(text))  # whose folder it is
    return {"status": "running", "experiment": cfg.experiment or None, "scale": cfg.scale,
            "group": group_name(cfg), "arch": cfg.model.arch, "depth": cfg.depth,
            # A single-stack model has `depth` layers and no second stack.
            "decoder_depth": (cfg.decoder_depth if cfg.decoder_depth is not None else cfg.depth)
            if cfg.model.arch == "transformer" else None,
            "seed": cfg.seed, "model": cfg.model.name, "d_model": cfg.model.d_model,
            "task": cfg.task.name, "steps": cfg.train.steps, "out_dir": str(out_dir),
            # Whose folder this is (stabexp.train.folder): the config's and the code's.
            "config_fingerprint": folder.fingerprint(cfg), "code_versions": [folder.code_version()],
            **({"parallel": cfg.train.parallel, "world_size": distributed.world()}
               if cfg.train.parallel != "none" else {})}


def _resumed_summary(state: Dict, out_dir: Path) -> Dict:
    summary = dict(state["summary"], status="running")
    summary["resumed_from"] = [*summary.get("resumed_from", []), state["step"]]
    versions = summary.get("code_versions") or ["unrecorded"]  # started before versions were kept
    if versions[-1] != folder.code_version():  # resumed by another version
        summary["code_versions"] = [*versions, folder.code_version()]
    log.info("resuming %s from its checkpoint at step %d", out_dir, state["step"])
    return summary
