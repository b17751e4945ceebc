"""Packed sweeps: the jobs of a multirun on one machine run several at a time, each in a process
of its own (Hydra's launcher `packed`, stabexp's default; `hydra/launcher=basic` runs them one
after another in the sweep's process). docs/scale.md ("Packed sweeps") says what a user sees.

How many at once, at how many threads each (`packing`), decided from the whole sweep, its
finished jobs included, so that a relaunched sweep resumes every run at the thread count it
started with (a run's last digits depend on it: train/build.py):
- threads per job: train.threads where the sweep sets it; else the cores shared out among the
  jobs that can run at once, one each when there are at least as many jobs as cores: for the
  tiny models of deepnet_depth and lm_depth, two one-thread runs side by side go 1.74-1.77x as
  fast as one at a time, where a second thread gives one run 1.2-1.3x (docs/benchmarks.md,
  "Packed sweeps");
- jobs at once: cores // threads, no more than the jobs' estimated peak memory lets the
  machine hold (memory.run_bytes; a 1,000-layer run takes gigabytes); on GPUs, as many per
  device as its memory holds, each GPU's jobs sharing out the cores.

Each job is a fresh process (its peak memory is its own), forked from a server process that
imported torch and stabexp once (multiprocessing's forkserver: nothing of this process's
threads or CUDA state is inherited). A job that fails, or whose process dies (killed for
memory), is said and recorded and the others go on. SIGINT, SIGTERM and SIGUSR1 reach this
process alone (the jobs have process groups of their own) and are passed on to every running
job, which checkpoints and stops as a run launched alone does (train/stop.py: a second Ctrl-C
stops at once); no new job starts, and the same command resumes the sweep.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from stabexp.terminal import duration

log = logging.getLogger("stabexp")

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
MEMORY_SHARE = 0.85  # of the machine's (a GPU's) memory the packed jobs' estimates may fill
# The exit code multiprocessing gives a job whose forkserver died before telling it (its server
# relays each child's exit status), and how long such a job, still running, gets to checkpoint.
FORKSERVER_LOST = 255
ORPHAN_WAIT = 600.0
# What each process on a GPU holds besides its tensors (memory.run_bytes counts tensors only): its
# CUDA context, cuBLAS workspaces and the caching allocator's slack. Several hundred MiB on an
# A100/H100 with torch 2.x; rounded up to 1 GiB.
GPU_PROCESS_BYTES = 2 ** 30
PROGRESS_SECONDS = 60.0  # a progress line at every job's end, and at least this often


@dataclass
class Job:
    """One job of the sweep: its Hydra config (hydra node included) and what packing reads."""
    idx: int
    overrides: List[str]
    config: DictConfig
    out_dir: Path
    memory: int       # estimated peak bytes (memory.run_bytes)
    cost: float       # steps still to run x layers: the share of the sweep's time it is expected to take
    threads: int      # train.threads (0: not set)
    on_gpu: bool


@dataclass
class Packing:
    at_once: int                  # jobs running at the same time
    threads: int                  # torch threads of every job
    memory_budget: int            # bytes the running jobs' estimates may add up to (on the CPU)
    devices: List[int] = field(default_factory=list)  # GPU of each slot (empty on the CPU)

    def describe(self) -> str:
        where = f" on GPU(s) {sorted(set(self.devices))}" if self.devices else ""
        return f"{self.at_once} job(s) at a time{where}, {self.threads} thread(s) each"


def cpus() -> int:
    """The CPUs this process may use (a cgroup or taskset may give it fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def packing(jobs: Sequence[Job], cores: int, memory: int, gpu_memory: Sequence[int] = (),
            at_most: Optional[int] = None, threads: Optional[int] = None) -> Packing:
    """How the sweep's jobs share the machine: `cores` CPUs, `memory` bytes of RAM (the whole
    machine's, so that the answer is the same when the sweep is relaunched), `gpu_memory` the
    bytes of each GPU when the jobs run on GPUs. `at_most` / `threads`: the launcher's keys
    (hydra.launcher.jobs, hydra.launcher.threads), None for automatic."""
    set_threads = {j.threads for j in jobs if j.threads}
    threads = threads or (max(set_threads) if set_threads else None)
    largest = max((j.memory for j in jobs), default=1)
    budget = int(memory * MEMORY_SHARE)
    if jobs and any(j.on_gpu for j in jobs) and gpu_memory:
        # As many jobs per GPU as its memory holds, and no more jobs than cores: a process that
        # feeds a GPU keeps a core busy launching its kernels.
        per_device = [max(1, int(m * MEMORY_SHARE) // (largest + GPU_PROCESS_BYTES)) for m in gpu_memory]
        fed = max(1, cores // threads) if threads else cores
        slots = min(len(jobs), sum(per_device), fed, at_most or sum(per_device))
        return Packing(slots, threads or max(1, cores // slots), budget, _spread(per_device, slots))
    fit = max(1, budget // largest)
    slots = min(max(1, len(jobs)), fit, max(1, cores // threads) if threads else cores)
    if at_most:
        slots = min(slots, at_most)
    return Packing(slots, threads or max(1, cores // slots), budget)


def _spread(per_device: List[int], slots: int) -> List[int]:
    """`slots` device indices, round robin over the devices while each has room."""
    room, chosen = list(per_device), []
    while len(chosen) < slots:
        for d in range(len(room)):
            if room[d] and len(chosen) < slots:
                room[d] -= 1
                chosen.append(d)
    return chosen


# --- the sweep's process ------------------------------------------------------------------

class _Stop:
    """The first stop signal this process received, passed on to every running job."""

    def __init__(self, running: Dict):
        self.running, self.signum, self.previous = running, None, {}

    def __enter__(self):
        for signum in FORWARDED:
            self.previous[signum] = signal.signal(signum, self._pass_on)
        return self

    def __exit__(self, *exc):
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)

    def _pass_on(self, signum, frame):
        if self.signum is None:
            self.signum = signum
            log.warning("stopping the sweep (%s): the running jobs checkpoint and stop, no other job starts",
                        signal.Signals(signum).name)
        for process in self.running:
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:
                pass


def _progress(done: int, failed: int, running: int, left: int, cost_done: float, cost_left: float,
              started: float) -> str:
    elapsed = time.perf_counter() - started
    eta = (f", about {duration(cost_left * elapsed / cost_done)} left"
           if cost_done > 0 and cost_left > 0 else "")
    return (f"# sweep: {done} done{f' ({failed} not finished)' if failed else ''}, {running} running, "
            f"{left} waiting{eta}")


def launch(jobs: List[Job], context, task_function, pack: Packing) -> Dict[int, Dict]:
    """Run `jobs` `pack.at_once` at a time; return each job's outcome by its idx: {"ran": True}
    or {"unfinished": [(out_dir, why)]}. Exits 128 + the signal after a stop request, once every
    running job has checkpointed."""
    ctx = multiprocessing.get_context("forkserver")
    # The server imports torch and the trainer once; each job is forked from it in milliseconds.
    ctx.set_forkserver_preload(["stabexp.train.trainer", "stabexp.app"])
    # In Hydra's order. Longest first (by steps x layers) was tried: deepnet_depth took 989 s
    # against 891 s in this order, its 100-layer runs side by side slowing each other more
    # than they gain at the end (docs/benchmarks.md).
    pending = list(jobs)
    running: Dict = {}      # process -> (job, slot, its message's pipe end, its lifeline's)
    free_slots = list(range(pack.at_once))
    outcomes: Dict[int, Dict] = {}
    started, last_line = time.perf_counter(), 0.0
    cost_total = sum(j.cost for j in jobs) or 1.0
    cost_done = 0.0
    # The server was started with this process's environment of then: each job gets today's.
    env_common = {**os.environ, "OMP_NUM_THREADS": str(pack.threads)}
    report = False  # a progress line is due: a job ended (said once the next ones have started)

    def say_progress():
        not_finished = sum(bool(o.get("unfinished")) for o in outcomes.values())
        cost_left = cost_total - cost_done - 0.5 * sum(j.cost for j, *_ in running.values())
        print(_progress(len(outcomes), not_finished, len(running), len(pending), cost_done,
                        cost_left if stop.signum is None else 0, started), file=sys.stderr, flush=True)

    with _Stop(running) as stop:
        while pending or running:
            while pending and free_slots and stop.signum is None:
                job = _next_fitting(pending, running, pack)
                if job is None:
                    break
                pending.remove(job)
                slot = free_slots.pop(0)
                env = dict(env_common)
                if pack.devices:
                    env["CUDA_VISIBLE_DEVICES"] = _visible_device(pack.devices[slot])
                reader, writer = ctx.Pipe(duplex=False)
                lifeline, held = ctx.Pipe(duplex=False)  # `held` is never written: closed when we end
                process = ctx.Process(target=run_job_process, name=f"stabexp-job-{job.idx}",
                                      args=(writer, lifeline, job, context, task_function, pack.threads,
                                            env, os.getcwd(), list(sys.path)))
                process.start()
                writer.close()
                lifeline.close()
                running[process] = (job, slot, reader, held)
                if stop.signum is not None:  # the signal came while it started
                    os.kill(process.pid, stop.signum)
            now = time.perf_counter()
            if report or (running and now - last_line >= PROGRESS_SECONDS):
                report, last_line = False, now
                say_progress()
            if not running:
                break
            ready = wait([p.sentinel for p in running], timeout=PROGRESS_SECONDS)
            for process in [p for p in list(running) if p.sentinel in ready]:
                job, slot, reader, held = running.pop(process)
                outcomes[job.idx] = _ended(process, job, reader)
                held.close()
                free_slots.append(slot)
                cost_done += job.cost
                report = True
        if report:
            say_progress()
    if stop.signum is not None:
        name = signal.Signals(stop.signum).name
        print(f"stabexp: stopped by {name}: {len(outcomes)} job(s) ended, {len(pending)} not started; "
              "the runs stopped have checkpoints and the same command resumes the sweep", file=sys.stderr)
        sys.exit(128 + stop.signum)
    return outcomes


def _visible_device(index: int) -> str:
    """The GPU `index` counts among those this process sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[index] if visible else str(index)


def _next_fitting(pending: List[Job], running: Dict, pack: Packing) -> Optional[Job]:
    """The first waiting job whose memory fits beside the running jobs' (a job too big to share
    the machine runs alone); None: wait for one to end."""
    if not running or pack.devices:  # a GPU's slots were counted from its memory in packing
        return pending[0]
    room = pack.memory_budget - sum(j.memory for j, *_ in running.values())
    return next((j for j in pending if j.memory <= room), None)


def _ended(process, job: Job, reader) -> Dict:
    """What a job's process said before it ended; a process that died without a word (killed,
    out of memory) is a failed job, recorded in its run folder for `stabexp status`."""
    try:
        message = reader.recv() if reader.poll() else None
    except (EOFError, OSError):  # died while saying it
        message = None
    reader.close()
    process.join()
    if message is not None:
        return message
    code = process.exitcode
    if code == FORKSERVER_LOST and _alive(process.pid):
        return _orphaned(process.pid, job)
    why = (f"its process was killed by {signal.Signals(-code).name}" if code and code < 0 else
           f"its process ended with exit code {code}") + (" (out of memory?)" if code == -signal.SIGKILL else "")
    log.error("job %s failed: %s", job.out_dir.name, why)
    _record_failure(job.out_dir, why)
    return {"unfinished": [(job.out_dir, f"failed: {why}")]}


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def _orphaned(pid: int, job: Job) -> Dict:
    """A job whose forkserver was killed: it runs on, but its end would go unseen. Stopped as a
    stopped sweep stops its jobs (SIGTERM: it checkpoints), then reported from its folder."""
    from stabexp.train.files import read_summary

    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + ORPHAN_WAIT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    status = (read_summary(job.out_dir) or {}).get("status")
    if status in ("completed", "diverged"):
        return {"ran": True, "unfinished": []}
    if status == "interrupted":
        why = ("interrupted: the sweep's process server was killed, and the job stopped at a checkpoint; the "
               "same command resumes it")
    else:
        why = f"failed: the sweep's process server was killed, and the job did not stop at a checkpoint ({status})"
        _record_failure(job.out_dir, why)
    log.error("job %s %s", job.out_dir.name, why)
    return {"unfinished": [(job.out_dir, why)]}


def _record_failure(out_dir: Path, why: str) -> None:
    """A run whose process died says so in its summary (it said "running"), as a failed run does."""
    from stabexp.train.files import SUMMARY, read_summary, write_json

    summary = read_summary(out_dir)
    if summary and summary.get("status") == "running":
        summary.update(status="failed", error=why)
        write_json(out_dir / SUMMARY, summary)


# --- a job's process ----------------------------------------------------------------------

def run_job_process(writer, lifeline, job: Job, context, task_function, threads: int,
                    env: Dict[str, str], cwd: str, path: List[str]) -> None:
    """In the job's own process: the job as Hydra's basic launcher would run it in the sweep's
    process; then a word back (which jobs did not finish, or that it stopped on request). The
    job's config is composed already: Hydra's singletons (its config store, its resolvers,
    which Hydra's joblib launcher carries over with cloudpickle) are the ones the forkserver's
    imports registered, stabexp's resolvers among them."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import run_job, setup_globals

    os.setpgrp()  # the terminal's Ctrl-C reaches the sweep's process alone, which passes it on
    _stop_with_the_sweep(lifeline)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:] = path
    import torch

    torch.set_num_threads(threads)
    from stabexp import unfinished
    from stabexp.train.recording import Progress

    Progress.bar_allowed = False  # bars of several processes on one terminal: lines instead
    setup_globals()
    HydraConfig.instance().set_config(job.config)
    unfinished.JOBS.clear()
    message: Dict = {"ran": True}
    try:
        run_job(hydra_context=context, config=job.config, task_function=task_function,
                job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        message["unfinished"] = list(unfinished.JOBS)
    except (SystemExit, KeyboardInterrupt) as stopped:  # stopped on request (a second Ctrl-C: at once)
        why = "stopped before the end: the same command resumes it"
        message = {"stopped": getattr(stopped, "code", 128 + signal.SIGINT), "unfinished": [(job.out_dir, why)]}
    finally:
        try:
            writer.send(message)
            writer.close()
        except OSError:  # the sweep's process is gone (killed): nobody to tell; the run's files say it
            pass


def _stop_with_the_sweep(lifeline) -> None:
    """SIGTERM to this job when the sweep's process ends however it ends (kill -9 included),
    which closes its end of `lifeline`: the job checkpoints and stops rather than running on
    with nobody to wait for it. (PR_SET_PDEATHSIG would not do: the job's parent is the
    forkserver, which lives as long as any job does.)"""
    import threading

    def watch():
        try:
            lifeline.recv()
        except (EOFError, OSError):
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sweep-lifeline", daemon=True).start()


def jobs_of(launcher_config: DictConfig, config_loader, job_overrides: Sequence[Sequence[str]],
            initial_job_idx: int) -> List[Job]:
    """Each job's config, as Hydra's launchers compose it, with what packing needs to know."""
    from hydra.core.hydra_config import HydraConfig

    from stabexp.memory import run_bytes, stack_depths

    jobs = []
    for i, overrides in enumerate(job_overrides):
        idx = initial_job_idx + i
        config = config_loader.load_sweep_config(launcher_config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = f"{config.hydra.job.name}_{idx}"
            config.hydra.job.num = idx
        HydraConfig.instance().set_config(config)
        out_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        task_cfg = task_config(config)
        layers = sum(stack_depths(task_cfg))
        on_gpu = task_cfg.train.device == "cuda" or (task_cfg.train.device == "auto" and _has_gpu())
        jobs.append(Job(idx, list(overrides), config, out_dir, run_bytes(task_cfg),
                        float(max(steps_left(out_dir, task_cfg.train.steps, task_cfg.overwrite), 1) * layers),
                        int(task_cfg.train.threads), on_gpu))
    return jobs


def steps_left(out_dir: Path, steps: int, overwrite: bool = False) -> int:
    """The steps a job has still to run: those past the checkpoint its folder holds and its
    summary names (a run stopped, to be resumed), all of them otherwise (no checkpoint, or
    `overwrite`, which starts the run again). A resumed sweep's time left is counted from these:
    a job resumed near its end takes minutes, not its whole run's time (its start and final
    evaluation aside, which this count leaves out)."""
    from stabexp.train.checkpoint import CHECKPOINT
    from stabexp.train.files import read_summary

    done = (read_summary(out_dir) or {}).get("checkpoint_step")
    if overwrite or not isinstance(done, int) or isinstance(done, bool) or not (Path(out_dir) / CHECKPOINT).is_file():
        return steps
    return min(max(steps - done, 0), steps)


def task_config(config: DictConfig) -> DictConfig:
    """The job's config without its hydra node: what the task function is given."""
    return OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])


def finished_before(job: Job) -> bool:
    """Whether the job's folder holds its finished run (left as it is: no process started)."""
    from stabexp.train import folder
    from stabexp.train.trainer import finished

    cfg = task_config(job.config)
    return not folder.refused(job.out_dir, cfg) and finished(job.out_dir, cfg) is not None


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_memory() -> List[int]:
    """Each visible GPU's memory in bytes (none on a CPU machine)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
