"""Command line: `stabexp run [hydra args]`, `stabexp list`.

`stabexp run` is a plain Hydra app (overrides, -m, --cfg job, --help, hydra/launcher=...).
Before handing over to Hydra it composes the config for every value a sweep will take and
checks it, so a user error is one line naming the bad value, never a traceback.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import List, Optional

import yaml

from stabexp.config import ConfigError, conf_dir, outputs_dir, run_name, unknown_key_message, validate

log = logging.getLogger("stabexp")

USAGE = """usage: stabexp run [OVERRIDES] [-m] [--cfg job] [--help]   train one run, or a sweep with -m
       stabexp list [--config-dir DIR]                     the control groups and experiment presets
       stabexp status [SWEEP_DIR]                          every run of a sweep: completed, running, ...
       stabexp report [SWEEP_DIR]                          a sweep as a markdown table (group x depth)
       stabexp bench [--sizes tiny,small] [--depths 6,18,50]  speed and memory against torch.nn.Transformer
Examples:
  stabexp run group=postln depth=18
  stabexp run -m group=postln,postln_warmup depth=6,18
  stabexp run experiment=deepnet_depth scale=quick
Run folders go under {outputs}"""

# Hydra flags that take a value, so the value is not read as an override.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
                     "-cn", "--config-dir", "-cd", "--experimental-rerun"}
_CONFIG_GROUPS = ("group", "model", "task", "optim", "experiment", "scale")


def _split_args(args: List[str]):
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


def _flags_first(args: List[str]) -> List[str]:
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


def _sweeps(overrides: List[str]) -> List[str]:
    """The overrides that sweep several values (comma lists, range, glob, ...)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.input_line for o in parsed if o.is_sweep_override()]


# The user's config folders of this command (--config-dir, hydra.searchpath=[file://...]), set
# by cmd_run / cmd_list: they extend the built-in conf/ the Hydra way.
_user_dirs: List[Path] = []


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


def _config_files(group: str) -> List[Path]:
    """The yaml files of a config group, built-in then the user's (a user's file of the same
    name wins, as in Hydra's search path)."""
    files = {}
    for root in (conf_dir(), *_user_dirs):
        for path in sorted((root / group).glob("*.yaml")):
            files[path.stem] = path
    return [files[k] for k in sorted(files)]


def _choices(group: str) -> List[str]:
    return [p.stem for p in _config_files(group)]


def _explain(override, line: str, err: Exception) -> str:
    """One line for a Hydra / OmegaConf composition error about `override`, whose value in
    the failing composition is `line` (one value of a sweep)."""
    key = override.key_or_group
    value = line.split("=", 1)[1] if "=" in line else ""
    text = f"{err} {err.__cause__ or ''}"
    if key in _CONFIG_GROUPS and ("Could not find" in text or "Could not load" in text):
        return f"{key}={value} is not a known {key}: choose one of {', '.join(_choices(key))}"
    if "not in struct" in text or "Could not override" in text or "Could not append" in text:
        return unknown_key_message(key.lstrip("+~"))
    first = str(err.__cause__ or err).strip().splitlines()[0]
    return f"{line}: {first}"


def check_overrides(overrides: List[str], multirun: bool, prepare_data: bool = True,
                    config_dirs: List[Path] = ()) -> bool:
    """Compose and validate the config for each value every override takes, the sweep a preset
    declares (hydra.sweeper.params) included, and (prepare_data) fetch and check the data each
    distinct task needs; raise ConfigError. Return True when the run is a multirun (-m, or a
    preset that sets hydra.mode=MULTIRUN)."""
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
            i = next((i for i, line in enumerate(combo) if _is_culprit(line, err)), 0)
            raise ConfigError(_explain(parsed[i], combo[i], err)) from None

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            parsed = parse(overrides)
            first = [c[0] for c in _values_of(parsed)]
            hydra_cfg = compose_one(parsed, first, return_hydra_config=True).hydra
            multirun = multirun or str(hydra_cfg.mode) in ("MULTIRUN", "RunMode.MULTIRUN")
            sweeps = [o for o in parsed if o.is_sweep_override()]
            if sweeps and not multirun:
                raise ConfigError(f"{sweeps[0].input_line} sweeps several values: add -m to run a multirun")
            # The preset's sweep, for the keys the command line does not set itself.
            on_cli = {o.get_key_element() for o in parsed}
            preset = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.get("params") or {}).items()
                      if k not in on_cli] if multirun else []
            parsed = parsed + parse(preset)
            candidates = _values_of(parsed)
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
            tasks = {}
            for combo in to_check:
                cfg = compose_one(parsed, combo)
                validate(cfg)
                tasks.setdefault(OmegaConf.to_yaml(cfg.task), cfg)
            if prepare_data:  # every value is good: now the data, once per task, before any job starts
                for cfg in tasks.values():
                    prepare(cfg)
    finally:
        GlobalHydra.instance().clear()
    return multirun


def _values_of(parsed) -> List[List[str]]:
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
            raise ConfigError(_empty_sweep(o))
        values.append([f"{key}={v}" for v in these])
    return values


def _empty_sweep(override) -> str:
    """A sweep with no value: a glob() that matched nothing, or glob() on a key that is not a
    config group (Hydra would run no job at all)."""
    key = override.get_key_element().lstrip("+~")
    if key in _CONFIG_GROUPS:
        return f"{override.input_line} matches no {key}: choose from {', '.join(_choices(key))}"
    return (f"{override.input_line}: glob() sweeps the options of a config group ({', '.join(_CONFIG_GROUPS)}) "
            f"and {key} is not one: sweep its values with a comma list, range() or choice()")


def _is_culprit(line: str, err: Exception) -> bool:
    key = line.split("=", 1)[0].lstrip("+~")
    text = f"{err} {err.__cause__ or ''}"
    return f"'{key}" in text or f"{key}/" in text or f"full_key: {key}" in text


def _hydra_main():
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name="config")
    def run(cfg) -> None:
        from stabexp.train.trainer import train

        from stabexp.train.files import RunLocked
        from stabexp.train.stop import RunStopped

        out_dir = Path(HydraConfig.get().runtime.output_dir)
        try:
            summary = train(cfg, out_dir)
        except ConfigError as err:
            print(f"stabexp: error: {err}", file=sys.stderr)
            sys.exit(2)
        except RunLocked as err:
            if str(HydraConfig.get().mode) in ("MULTIRUN", "RunMode.MULTIRUN"):
                # Another process runs this job (two launches of one sweep share the work).
                log.warning("skipped: %s", err)
                return
            print(f"stabexp: error: {err}", file=sys.stderr)
            sys.exit(2)
        except RunStopped as stop:
            print(f"stabexp: stopped by {stop}: {out_dir} has a checkpoint; the same command resumes it",
                  file=sys.stderr)
            sys.exit(128 + stop.signum)
        eval_loss, bleu = summary.get("final_eval_loss"), summary.get("test_bleu")
        log.info("%s: %s after %s steps, eval loss %s%s, results in %s", summary["group"],
                 summary["status"], summary.get("steps_done"),
                 f"{eval_loss:.4f}" if eval_loss is not None else "n/a",
                 f", test BLEU {bleu:.2f}" if bleu is not None else "", out_dir)

    return run


def cmd_run(args: List[str]) -> int:
    global _user_dirs
    ours, hydra_overrides, multirun, wants_help = _split_args(args)
    prints_config = bool({"--cfg", "-c"} & set(args))
    if prints_config and multirun:  # Hydra's own rule, which it reports with a traceback
        print("stabexp: error: --cfg prints the config of one run and cannot go with -m: drop -m "
              "(and give each swept key one value)", file=sys.stderr)
        return 2
    try:
        # Printing the config (--cfg) or the help needs no data; the help composes the config
        # with the overrides too, so a bad one is the same one line as without --help.
        _user_dirs = user_config_dirs(args)
        multirun = check_overrides(ours, multirun, prepare_data=not (prints_config or wants_help),
                                   config_dirs=_user_dirs)
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    if wants_help:
        # Hydra composes its help as one run, where a sweep is an error: show the config
        # without the swept keys.
        args = [a for a in args if a not in _sweeps(ours)]
        multirun = False
    extra = []
    if multirun and not any(h.startswith("hydra.sweep.dir=") for h in hydra_overrides):
        # One sweep folder named from the whole sweep, so re-running it finds its jobs again.
        sweep_dir = outputs_dir() / "multirun" / run_name(ours)
        extra.append(f"hydra.sweep.dir='{sweep_dir}'")
    # Flags first, then every override in one run: Hydra's argparse takes the overrides as one
    # positional list, so an override after a flag (`... --cfg job hydra.sweep.dir=...`) is refused.
    sys.argv = ["stabexp", *_flags_first(args), *extra]
    _hydra_main()()
    return 0


def _preset_description(path: Path) -> str:
    """The first comment line of a preset file after `# @package`: what it reproduces, its cost."""
    lines = [line[1:].strip() for line in path.read_text().splitlines()
             if line.startswith("#") and "@package" not in line]
    return lines[0] if lines else ""


def cmd_list(args: List[str] = ()) -> int:
    global _user_dirs
    try:
        _user_dirs = user_config_dirs(list(args))
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    rows = []
    for path in _config_files("group"):
        g = yaml.safe_load(path.read_text()) or {}
        rows.append((g.get("name", path.stem), g.get("description", ""), g.get("citation", "")))
    if not rows:
        print(f"stabexp: error: no control group found in {conf_dir() / 'group'}: the package's configs "
              "are missing (reinstall stabexp, or set STABEXP_CONF to a folder holding them)", file=sys.stderr)
        return 1
    width = max(len(r[0]) for r in rows)
    print("Control groups (group=NAME):")
    for name, description, citation in rows:
        print(f"  {name:<{width}}  {description}")
        print(f"  {'':<{width}}  [{citation}]")
    presets = _config_files("experiment")
    width = max((len(p.stem) for p in presets), default=0)
    print("\nExperiment presets (stabexp run experiment=NAME [scale=quick]; all: make reproduce):")
    for path in presets:
        print(f"  {path.stem:<{width}}  {_preset_description(path)}")
    print(f"\nConfigs: {', '.join(str(d) for d in (conf_dir(), *_user_dirs))}; run folders: {outputs_dir()}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.format(outputs=outputs_dir()))
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        return cmd_run(rest)
    if command == "list":
        return cmd_list(rest)
    if command == "status":
        from stabexp.status import main as status_main

        return status_main(rest)
    if command == "report":
        from stabexp.report import main as report_main

        return report_main(rest)
    if command == "bench":
        from stabexp.bench import main as bench_main

        return bench_main(rest)
    print(f"stabexp: error: unknown command {command!r}: use run, list, status, report or bench", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
