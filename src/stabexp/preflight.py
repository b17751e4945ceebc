"""The checks `stabexp run` makes before Hydra starts: every value a sweep will take is
composed and validated against the schema (stabexp.config), the user's config folders exist,
and the data each task needs is in place, so that a user error is one line naming the bad value
and what is allowed (exit code 2), never a traceback, and nothing is written.

`preflight(args)` is the whole check; tests/test_docs.py runs it on every command the docs show.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

from stabexp import distributed, tracking
from stabexp.config import ConfigError, conf_dir, unknown_key_message, validate, validate_world

# Hydra flags that take a value, so the value is not read as an override.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
                     "-cn", "--config-dir", "-cd", "--experimental-rerun"}
_CONFIG_GROUPS = ("group", "model", "task", "optim", "logger", "experiment", "scale", "robustness")


def split_args(args: List[str]):
    """(overrides for our config, hydra overrides, is_multirun, wants_help)."""
    ours, hydra_overrides, skip = [], [], False
    multirun = wants_help = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in _FLAGS_WITH_VALUE:
            skip = True
        elif a in ("-m", "--multirun"):
            multirun = True
        elif a in ("-h", "--help", "--hydra-help", "--info", "-i", "--version", "--shell-completion", "-sc"):
            wants_help = True
        elif a.startswith("-"):
            continue
        elif a.lstrip("+~").startswith("hydra"):
            hydra_overrides.append(a)
        else:
            ours.append(a)
    return ours, hydra_overrides, multirun, wants_help


def flags_first(args: List[str]) -> List[str]:
    """The same arguments with the flags (and their values) before the overrides."""
    flags, overrides, i = [], [], 0
    while i < len(args):
        if args[i].startswith("-"):
            takes_value = args[i] in _FLAGS_WITH_VALUE and i + 1 < len(args)
            flags += args[i:i + 2] if takes_value else args[i:i + 1]
            i += 2 if takes_value else 1
        else:
            overrides.append(args[i])
            i += 1
    return flags + overrides


def sweeps(overrides: List[str]) -> List[str]:
    """The overrides that sweep several values (comma lists, range, glob, ...)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.input_line for o in parsed if o.is_sweep_override()]


def user_config_dirs(args: List[str]) -> List[Path]:
    """The folders a command line adds to Hydra's config search path: `--config-dir DIR` (or
    -cd) and the file:// entries of `hydra.searchpath=[...]` (pkg:// entries are modules)."""
    dirs = []
    for i, a in enumerate(args):
        if a in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(args[i + 1])
        elif a.startswith("--config-dir="):
            dirs.append(a.split("=", 1)[1])
        elif a.lstrip("+").startswith("hydra.searchpath="):
            entries = a.split("=", 1)[1].strip("[]").split(",")
            dirs += [e.strip().strip("'\"")[len("file://"):] for e in entries
                     if e.strip().strip("'\"").startswith("file://")]
    for d in dirs:
        if not Path(d).is_dir():
            raise ConfigError(f"config folder {d} does not exist: --config-dir and hydra.searchpath "
                              "take folders holding group/, model/, experiment/ ... of your own")
    return [Path(d).resolve() for d in dirs]


def config_files(group: str, config_dirs: List[Path] = ()) -> List[Path]:
    """The yaml files of a config group, built-in then the user's (a user's file of the same
    name wins, as in Hydra's search path)."""
    files = {}
    for root in (conf_dir(), *config_dirs):
        for path in sorted((root / group).glob("*.yaml")):
            files[path.stem] = path
    return [files[k] for k in sorted(files)]


def _choices(group: str, config_dirs: List[Path] = ()) -> List[str]:
    return [p.stem for p in config_files(group, config_dirs)]


def _explain(override, line: str, err: Exception, config_dirs: List[Path] = ()) -> str:
    """One line for a Hydra / OmegaConf composition error about `override`, whose value in
    the failing composition is `line` (one value of a sweep)."""
    key = override.key_or_group
    value = line.split("=", 1)[1] if "=" in line else ""
    text = f"{err} {err.__cause__ or ''}"
    if key in _CONFIG_GROUPS and ("Could not find" in text or "Could not load" in text):
        return f"{key}={value} is not a known {key}: choose one of {', '.join(_choices(key, config_dirs))}"
    if "not in struct" in text or "Could not override" in text or "Could not append" in text:
        return unknown_key_message(key.lstrip("+~"))
    first = str(err.__cause__ or err).strip().splitlines()[0]
    return f"{line}: {first}"


def check_overrides(overrides: List[str], multirun: bool, prepare_data: bool = True,
                    config_dirs: List[Path] = (), launcher: List[str] = (),
                    world: Optional[Tuple[int, bool]] = None) -> Tuple[bool, Path]:
    """Compose and validate the config for each value every override takes, the sweep a preset
    declares (hydra.sweeper.params) included, and (prepare_data) fetch and check the data each
    distinct task needs; raise ConfigError. Return (multirun, the run folder Hydra would make for
a single run), multirun True when the run is a multirun (-m, or a
    preset that sets hydra.mode=MULTIRUN). `launcher`: the command's hydra/launcher overrides
    (the processes a job runs on)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from stabexp.data import prepare

    def parse(lines):
        # With Hydra's config loader, as its sweepers parse: glob() lists a config group's options.
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        try:
            return parser.parse_overrides(lines)
        except Exception as err:
            tilde = next((line for line in lines if "=~" in line), None)
            if tilde is not None:  # the shell leaves a ~ after `key=` alone, and Hydra refuses it
                raise ConfigError(f"{tilde}: Hydra cannot read '~' in a value: write the path out "
                                  f"(for example $HOME/...)") from None
            raise ConfigError(f"cannot parse the overrides: {str(err).splitlines()[0]}") from None

    # The user's config folders, as Hydra adds --config-dir to its search path.
    searchpath = ([f"hydra.searchpath=[{','.join('file://' + str(d) for d in config_dirs)}]"]
                  if config_dirs else [])

    def compose_one(parsed, combo, **kwargs):
        try:
            return compose(config_name="config", overrides=[*combo, *searchpath], **kwargs)
        except Exception as err:
            if not parsed:
                raise ConfigError(str(err).splitlines()[0]) from None
            # The longest key the error names: `logger.tensorboard.dirr`, not `logger`.
            culprits = [i for i, line in enumerate(combo) if _is_culprit(line, err)]
            i = max(culprits, key=lambda i: len(combo[i].split("=", 1)[0]), default=0)
            raise ConfigError(_explain(parsed[i], combo[i], err, config_dirs)) from None

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            parsed = parse(overrides)
            # The command's own lines when nothing sweeps: Hydra names the run folder from them
            # (`x=true` stays `true`, where a parsed value would print as `True`).
            first = ([c[0] for c in _values_of(parsed, config_dirs)]
                     if any(o.is_sweep_override() for o in parsed) else list(overrides))
            hydra_cfg = compose_one(parsed, first, return_hydra_config=True).hydra
            run_dir = Path(str(hydra_cfg.run.dir))
            multirun = multirun or str(hydra_cfg.mode) in ("MULTIRUN", "RunMode.MULTIRUN")
            sweeps = [o for o in parsed if o.is_sweep_override()]
            if sweeps and not multirun:
                raise ConfigError(f"{sweeps[0].input_line} sweeps several values: add -m to run a multirun")
            # The preset's sweep, for the keys the command line does not set itself.
            on_cli = {o.get_key_element() for o in parsed}
            preset = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.get("params") or {}).items()
                      if k not in on_cli] if multirun else []
            parsed = parsed + parse(preset)
            candidates = _values_of(parsed, config_dirs)
            sampled = [o for o in parsed if o.is_sweep_override() and not o.is_discrete_sweep()]
            if sampled and str(hydra_cfg.sweeper.get("_target_", "")).endswith("BasicSweeper"):
                raise ConfigError(f"{sampled[0].input_line}: Hydra's basic sweeper cannot sample an interval; it "
                                  "takes comma lists, range(), choice() and glob() (interval() needs a sampling "
                                  "sweeper such as hydra/sweeper=optuna)")
            # Every value of every override, the others at their first value.
            to_check = [[c[0] for c in candidates]]
            for i, c in enumerate(candidates):
                for v in c[1:]:
                    to_check.append([*to_check[0][:i], v, *to_check[0][i + 1:]])
            world, grouped = world or _world(compose_one([], [*first, *launcher], return_hydra_config=True).hydra
                                             if launcher else hydra_cfg)
            tasks = {}
            for combo in to_check:
                cfg = compose_one(parsed, combo)
                validate(cfg)
                validate_world(cfg, world, grouped)
                tracking.check(cfg)
                tasks.setdefault(OmegaConf.to_yaml(cfg.task), cfg)
            if prepare_data:  # every value is good: now the data, once per task, before any job starts
                for cfg in tasks.values():
                    prepare(cfg)
    finally:
        GlobalHydra.instance().clear()
    return multirun, run_dir


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


def _values_of(parsed, config_dirs: List[Path] = ()) -> List[List[str]]:
    """`key=value` for every value each override takes: one, or each of a sweep's (an interval,
    which a sampling sweeper draws from, by its two ends)."""
    from hydra.errors import HydraException

    values = []
    for o in parsed:
        key = o.get_key_element()
        try:
            if not o.is_sweep_override():
                these = [o.get_value_element_as_str()]
            elif o.is_discrete_sweep():
                these = list(o.sweep_string_iterator())
            else:
                these = [str(o.value().start), str(o.value().end)]
        except HydraException as err:
            raise ConfigError(f"{o.input_line}: {str(err).splitlines()[0]}") from None
        if not these:
            raise ConfigError(_empty_sweep(o, config_dirs))
        values.append([f"{key}={v}" for v in these])
    return values


def _empty_sweep(override, config_dirs: List[Path] = ()) -> str:
    """A sweep with no value: a glob() that matched nothing, or glob() on a key that is not a
    config group (Hydra would run no job at all)."""
    key = override.get_key_element().lstrip("+~")
    if key in _CONFIG_GROUPS:
        return f"{override.input_line} matches no {key}: choose from {', '.join(_choices(key, config_dirs))}"
    return (f"{override.input_line}: glob() sweeps the options of a config group ({', '.join(_CONFIG_GROUPS)}) "
            f"and {key} is not one: sweep its values with a comma list, range() or choice()")


def _is_culprit(line: str, err: Exception) -> bool:
    key = line.split("=", 1)[0].lstrip("+~")
    text = f"{err} {err.__cause__ or ''}"
    return f"'{key}" in text or f"{key}/" in text or f"full_key: {key}" in text


class Checked(NamedTuple):
    """What `stabexp run` needs to know of a command line once it is checked."""

    overrides: List[str]          # the overrides of our config (not hydra.*)
    hydra_overrides: List[str]    # hydra.* overrides
    multirun: bool                # -m, or a preset that sets hydra.mode=MULTIRUN
    wants_help: bool              # --help and Hydra's other informational flags
    config_dirs: List[Path]       # the user's config folders (--config-dir, hydra.searchpath)
    run_dir: Path                 # where a single run writes (a sweep: stabexp.cli names the folder)


def preflight(args: List[str], prepare_data: bool = True, world: Optional[Tuple[int, bool]] = None) -> Checked:
    """Check a `stabexp run` command line (the arguments after `run`); raise ConfigError with
    the one line to print. Printing the config (--cfg) or the help needs no data; the help
    composes the config with the overrides too, so a bad one is the same one line as without it."""
    ours, hydra_overrides, multirun, wants_help = split_args(args)
    prints_config = bool({"--cfg", "-c"} & set(args))
    if prints_config and multirun:  # Hydra's own rule, which it reports with a traceback
        raise ConfigError("--cfg prints the config of one run and cannot go with -m: drop -m "
                          "(and give each swept key one value)")
    config_dirs = user_config_dirs(args)
    launcher = [h for h in hydra_overrides if h.lstrip("+").startswith(("hydra/launcher", "hydra.launcher"))]
    _check_packing(launcher)
    multirun, run_dir = check_overrides(ours, multirun, prepare_data=prepare_data and not (prints_config or wants_help),
                                        config_dirs=config_dirs, launcher=launcher, world=world)
    return Checked(ours, hydra_overrides, multirun, wants_help, config_dirs, run_dir)


def _check_packing(launcher: List[str]) -> None:
    """The packed launcher's keys (hydra.launcher.jobs, .threads): a whole number >= 1 or null."""
    for h in launcher:
        key, _, value = h.lstrip("+").partition("=")
        if key in ("hydra.launcher.jobs", "hydra.launcher.threads") and value != "null" \
                and not (value.isdigit() and int(value) >= 1):
            raise ConfigError(f"{h} is not allowed: {key} is a whole number >= 1, or null for as many "
                              "as the machine allows")


def make_folder(path: Path, what: str = "run folder") -> None:
    """Create `path` (and its parents) now, so that a folder that cannot be made (no such
    device, no permission, a read-only or full disk) is one line, not Hydra's traceback."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the {what} {path}: {err.strerror or err}") from None
