"""The `packed` launcher: Hydra's Launcher interface over stabexp.sweep, which decides how many
jobs run at once and at how many threads, and runs them. Only Hydra is imported here: Hydra
imports every launcher module when it starts, torch comes with the first sweep."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_plugins.stabexp_launcher.conf import PackedLauncherConf  # noqa: F401  (stores hydra/launcher=packed)

log = logging.getLogger("stabexp")


class PackedLauncher(Launcher):
    def __init__(self, jobs: Optional[int] = None, threads: Optional[int] = None) -> None:
        self.jobs, self.threads = jobs, threads
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from stabexp import sweep, unfinished
        from stabexp.memory import total_bytes

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        jobs = sweep.jobs_of(self.config, self.hydra_context.config_loader, job_overrides, initial_job_idx)
        pack = sweep.packing(jobs, sweep.cpus(), total_bytes(), sweep.gpu_memory() if
                             any(j.on_gpu for j in jobs) else (), self.jobs, self.threads)
        waiting = [j for j in jobs if not sweep.finished_before(j)]
        log.info("%d job(s) in %s: %d finished before, %s", len(jobs), self.config.hydra.sweep.dir,
                 len(jobs) - len(waiting), pack.describe())
        for job in waiting:
            log.info("\t#%d : %s", job.idx, " ".join(filter_overrides(job.overrides)))
        outcomes = sweep.launch(waiting, self.hydra_context, self.task_function, pack)
        returns = []
        for job in jobs:
            unfinished.JOBS.extend(outcomes.get(job.idx, {}).get("unfinished", []))
            # What a job's failure is said by: its line now, and cmd_run's sum at the end (the
            # sweep is not stopped by raising it, as Hydra's sweeper would for a failed status).
            returns.append(JobReturn(overrides=list(job.overrides), cfg=sweep.task_config(job.config),
                                     hydra_cfg=job.config, working_dir=str(job.out_dir),
                                     task_name=job.config.hydra.job.name, status=JobStatus.COMPLETED))
        return returns
