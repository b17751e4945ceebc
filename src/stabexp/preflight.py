"""The checks `stabexp run` makes before Hydra starts: every value a sweep will take is
composed and validated against the schema (stabexp.config), the user's config folders exist,
and the data each task needs is in place, so that a user error is one line naming the bad value
and what is allowed (exit code 2), never a traceback, and nothing is written.

`preflight(args)` is the whole check; tests/test_docs.py runs it on every command the docs show.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

from stabexp import distributed
from stabexp.compose import sweep_cells
from stabexp.config import ConfigError
from stabexp.paths import user_config_dirs

# Hydra's flags that ask for information and run nothing.
_INFORMATION = ("help", "hydra_help", "info", "shell_completion")


def parse_command(args: List[str]):
    """A `stabexp run` command line read by Hydra's own argument parser (the one @hydra.main
    uses), flags and overrides in any order; a flag it does not know is a ConfigError."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message):
        raise ConfigError(f"{message} (stabexp run --help lists Hydra's flags)")

    parser.error = refuse
    return parser.parse_intermixed_args(args)


def flags_of(args: List[str], overrides: List[str]) -> List[str]:
    """The flags of a command line with their values, in the order typed: the arguments that are
    not its overrides (Hydra's parser takes those as one positional list, so the command handed
    on to it is the overrides and then the flags)."""
    left, flags = list(overrides), []
    for a in args:
        if a in left:
            left.remove(a)
        else:
            flags.append(a)
    return flags


def check_overrides(overrides: List[str], multirun: bool, prepare_data: bool = True,
                    config_dirs: List[Path] = (), hydra_overrides: List[str] = (),
                    world: Optional[Tuple[int, bool]] = None) -> Tuple[bool, int]:
    """Compose and check the config for each value every override takes (stabexp.compose), on
    the processes each job will run on, and (prepare_data) fetch and check the data each
    distinct task needs; raise ConfigError. Return whether the run is a multirun, and its job count.
    `hydra_overrides`: the command's hydra.* and hydra/... ones (the launcher among them: the
    processes a job runs on)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError

    from stabexp.data import prepare
    from stabexp.train.trainer import check_config

    cells = sweep_cells(overrides, multirun, config_dirs, hydra_overrides)
    world, grouped = world or _world(cells.hydra)
    tasks = {}
    for cfg in cells.configs:
        try:
            check_config(cfg, world, grouped)
        except ConfigAttributeError as err:  # a key every run reads, deleted by ~KEY
            key = err.full_key or "a key"
            deleted = next((o for o in overrides if o.startswith("~")), f"~{key}")
            raise ConfigError(f"{deleted} deletes {key}, which every run reads: set it instead "
                              f"({key}=VALUE)") from None
        tasks.setdefault(OmegaConf.to_yaml(cfg.task), cfg)
    if prepare_data:  # every value is good: now the data, once per task, before any job starts
        for cfg in tasks.values():
            prepare(cfg)
    return cells.multirun, cells.job_count


def _world(hydra_cfg) -> Tuple[int, bool]:
    """(processes, in a process group) each job will run on: this one's (torchrun's, srun's), or,
    when Hydra's submitit launcher starts the jobs elsewhere, its nodes x tasks_per_node."""
    if distributed.active():
        return distributed.world(), True
    if distributed.launched():  # one of K processes, before their group forms
        return distributed.launched_world(), True
    launcher = hydra_cfg.launcher
    if "submitit" not in str(launcher.get("_target_", "")):
        return 1, False
    tasks = int(launcher.get("nodes") or 1) * int(launcher.get("tasks_per_node") or 1)
    return tasks, tasks > 1


class Checked(NamedTuple):
    """What `stabexp run` needs to know of a command line once it is checked."""

    overrides: List[str]          # the overrides of our config (not hydra.*)
    hydra_overrides: List[str]    # hydra.* overrides
    flags: List[str]              # Hydra's flags with their values, as typed
    multirun: bool                # -m, or a preset that sets hydra.mode=MULTIRUN
    wants_help: bool              # --help and Hydra's other informational flags
    config_dirs: List[Path]       # the user's config folders (--config-dir, hydra.searchpath)
    job_count: int = 1            # how many jobs the command runs (0: a sampling sweeper's, not known here)


def preflight(args: List[str], prepare_data: bool = True, world: Optional[Tuple[int, bool]] = None) -> Checked:
    """Check a `stabexp run` command line (the arguments after `run`); raise ConfigError with
    the one line to print. Printing the config (--cfg) or the help needs no data; the help
    composes the config with the overrides too, so a bad one is the same one line as without it."""
    command = parse_command(args)
    ours = [o for o in command.overrides if not o.lstrip("+~").startswith("hydra")]
    hydra_overrides = [o for o in command.overrides if o not in ours]
    wants_help = any(getattr(command, flag) for flag in _INFORMATION)
    if command.cfg and command.multirun:  # Hydra's own rule, which it reports with a traceback
        raise ConfigError("--cfg prints the config of one run and cannot go with -m: drop -m "
                          "(and give each swept key one value)")
    config_dirs = user_config_dirs(command.config_dir, hydra_overrides)
    launcher = [h for h in hydra_overrides if h.lstrip("+").startswith(("hydra/launcher", "hydra.launcher"))]
    _check_packing(launcher)
    multirun, job_count = check_overrides(ours, command.multirun, config_dirs=config_dirs,
                                          hydra_overrides=hydra_overrides, world=world,
                                          prepare_data=prepare_data and not (command.cfg or wants_help))
    return Checked(ours, hydra_overrides, flags_of(args, command.overrides), multirun, wants_help, config_dirs,
                   job_count)


def _check_packing(launcher: List[str]) -> None:
    """The packed launcher's keys (hydra.launcher.jobs, .threads): a whole number >= 1 or null."""
    for h in launcher:
        key, _, value = h.lstrip("+").partition("=")
        if key in ("hydra.launcher.jobs", "hydra.launcher.threads") and value != "null" \
                and not (value.isdigit() and int(value) >= 1):
            raise ConfigError(f"{h} is not allowed: {key} is a whole number >= 1, or null for as many "
                              "as the machine allows")
