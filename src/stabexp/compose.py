"""Configs composed from overrides the Hydra way, outside a Hydra app: one run's (`compose`) and
every cell a sweep will run (`sweep_cells`), each value of every override composed once, the
sweep a preset declares (hydra.sweeper.params) included; a composition error is one line naming
the override and what is allowed (ConfigError), never Hydra's traceback.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, NamedTuple, Optional

from omegaconf import DictConfig

from stabexp.config import ConfigError, unknown_key_message
from stabexp.paths import conf_dir, config_files, config_groups


def compose(overrides=(), return_hydra_config: bool = False) -> DictConfig:
    """The config `stabexp run OVERRIDES` runs, composed from the built-in configs outside a
    Hydra app (scripts, tests, a notebook); Hydra's global state is left as it was found: clear."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            return hydra_compose(config_name="config", overrides=list(overrides),
                                 return_hydra_config=return_hydra_config)
    finally:
        GlobalHydra.instance().clear()


def sweeps(overrides: List[str]) -> List[str]:
    """The overrides that sweep several values (comma lists, range, glob, ...)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.input_line for o in parsed if o.is_sweep_override()]


def _hydra_reason(err: Exception) -> str:
    """Hydra's parser error in words: its lexer names tokens ('<EOF>', {ID, ESC, ...})."""
    import re

    text = str(err).splitlines()[0]
    found = re.search(r"(?:mismatched|extraneous) input '(.*?)'", text)
    if found is None:
        return text
    if found.group(1) == "<EOF>":
        return "it ends where a value was expected"
    return f"Hydra's parser stops at {found.group(1)!r}"


def _refuse_a_key_given_twice(parsed) -> None:
    """Hydra keeps the last of two overrides of one key and drops the first without a word: a
    plain value given again is replaced (what a script that appends to a command relies on), but
    a sweep given first loses its values (`'seed=range(0,3)' seed=4,5` runs seeds 4 and 5 only),
    so that is refused."""
    first = {}
    for o in parsed:
        key = o.get_key_element()
        before = first.get(key)
        if before is not None and before.is_sweep_override():
            raise ConfigError(f"{key} is given twice ({before.input_line} and {o.input_line}): give it once, with "
                              f"every value it is to take (a sweep is one override: {key.lstrip('+~')}=a,b,c)")
        first[key] = o


class Cells(NamedTuple):
    multirun: bool           # -m, or a preset that sets hydra.mode=MULTIRUN
    hydra: DictConfig        # the hydra node a job runs under (the command's hydra.* overrides applied)
    configs: List[DictConfig]  # the first cell, then each other value of each override in turn
    job_count: int           # how many jobs the sweep runs (1 for a single run; 0 where a sweeper samples them)


def sweep_cells(overrides: List[str], multirun: bool, config_dirs: List[Path] = (),
                hydra_overrides: List[str] = ()) -> Cells:
    """The config for each value every override takes (the others at their first value), with
    the user's config folders on the search path; `hydra_overrides`: the command's hydra.* and
    hydra/... overrides, composed with the first cell. A sweep without -m, an interval under the
    basic sweeper, a glob() that matches nothing, a range() with no value: ConfigError."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

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
            bad = next((line for line in lines if not _parses(parser, line)), None)
            if bad is None:
                raise ConfigError(f"cannot parse the overrides: {str(err).splitlines()[0]}") from None
            raise ConfigError(f"cannot parse the override {bad!r}: {_hydra_reason(err)}; a value with a space, "
                              f"'=', ',' or a bracket of its own goes in quotes, as in 'key=\"a b\"' (and a sweep's "
                              "values are separated by commas with no comma after the last)") from None

    def _parses(parser, line) -> bool:
        try:
            parser.parse_overrides([line])
            return True
        except Exception:
            return False

    # The user's config folders, as Hydra adds --config-dir to its search path.
    searchpath = ([f"hydra.searchpath=[{','.join('file://' + str(d) for d in config_dirs)}]"]
                  if config_dirs else [])

    def compose_one(parsed, combo, **kwargs):
        try:
            return hydra_compose(config_name="config", overrides=[*combo, *searchpath], **kwargs)
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
            _refuse_a_key_given_twice(parsed)
            # The command's own lines when nothing sweeps: Hydra names the run folder from them
            # (`x=true` stays `true`, where a parsed value would print as `True`).
            first = ([c[0] for c in _values_of(parsed, config_dirs)]
                     if any(o.is_sweep_override() for o in parsed) else list(overrides))
            hydra_cfg = compose_one(parsed, first, return_hydra_config=True).hydra
            multirun = multirun or str(hydra_cfg.mode) in ("MULTIRUN", "RunMode.MULTIRUN")
            swept = [o for o in parsed if o.is_sweep_override()]
            if swept and not multirun:
                raise ConfigError(f"{swept[0].input_line} sweeps several values: add -m to run a multirun")
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
            # The command's own hydra overrides (its search path is config_dirs, added to each).
            hydra_lines = [h for h in hydra_overrides if not h.lstrip("+").startswith("hydra.searchpath=")]
            if hydra_lines:
                hydra_cfg = compose_one([*parsed[:len(first)], *parse(hydra_lines)], [*first, *hydra_lines],
                                        return_hydra_config=True).hydra
            # Every value of every override, the others at their first value.
            base, groups = [c[0] for c in candidates], config_groups(config_dirs)
            configs = [compose_one(parsed, base)]
            for i, c in enumerate(candidates):
                for v in c[1:]:
                    combo = [*base[:i], v, *base[i + 1:]]
                    configs.append(_with_value(configs[0], parse([v])[0], groups) or compose_one(parsed, combo))
            return Cells(multirun, hydra_cfg, configs, 0 if sampled else math.prod(len(c) for c in candidates))
    finally:
        GlobalHydra.instance().clear()


def _with_value(cfg: DictConfig, value, groups: List[str]) -> Optional[DictConfig]:
    """The first cell's config with one plain key set to another of its sweep's values, as Hydra
    applies a value override after composing (OmegaConf.update): a sweep of 1,000 seeds costs one
    composition, not 1,000. None where the value changes the composition itself (a config group,
    a key added with + or deleted with ~) or does not fit the key: then it is composed."""
    import copy

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    key = value.key_or_group
    if "/" in key or key.split("@")[0] in groups or value.is_add() or value.is_delete() or value.is_force_add():
        return None
    try:
        changed = copy.deepcopy(cfg)  # its struct flag and schema types kept
        OmegaConf.update(changed, key, value.value(), merge=True)
    except OmegaConfBaseException:
        return None
    return changed


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
        except (HydraException, ValueError) as err:  # range(2,4,0): Python's own ValueError
            raise ConfigError(f"{o.input_line}: {str(err).splitlines()[0]}") from None
        if not these:
            raise ConfigError(_empty_sweep(o, config_dirs))
        values.append([f"{key}={v}" for v in these])
    return values


def _choices(group: str, config_dirs: List[Path] = ()) -> str:
    return ", ".join(p.stem for p in config_files(group, config_dirs))


def _explain(override, line: str, err: Exception, config_dirs: List[Path] = ()) -> str:
    """One line for a Hydra / OmegaConf composition error about `override`, whose value in
    the failing composition is `line` (one value of a sweep)."""
    key = override.key_or_group
    value = line.split("=", 1)[1] if "=" in line else ""
    text = f"{err} {err.__cause__ or ''}"
    if key in config_groups(config_dirs) and ("Could not find" in text or "Could not load" in text):
        return f"{key}={value} is not a known {key}: choose one of {_choices(key, config_dirs)}"
    if key.lstrip("+").startswith("hydra.sweeper.params"):  # Hydra fails on it, with a traceback
        return (f"{line}: Hydra cannot set its sweeper's params on the command line: sweep a key there "
                f"with -m KEY=A,B, or in a preset's hydra.sweeper.params")
    if "not in struct" in text or "Could not override" in text or "Could not append" in text:
        return unknown_key_message(key.lstrip("+~"))
    first = str(err.__cause__ or err).strip().splitlines()[0]
    return f"{line}: {first}"


def _empty_sweep(override, config_dirs: List[Path] = ()) -> str:
    """A sweep with no value (Hydra would run no job at all): a range() that is empty, a glob()
    that matched nothing, or glob() on a key that is not a config group."""
    from hydra.core.override_parser.types import Glob

    key = override.get_key_element().lstrip("+~")
    if not isinstance(override.value(), Glob):
        return f"{override.input_line} sweeps no value: give {key} at least one (range(a,b) takes a < b)"
    if key in config_groups(config_dirs):
        return f"{override.input_line} matches no {key}: choose from {_choices(key, config_dirs)}"
    return (f"{override.input_line}: glob() sweeps the options of a config group "
            f"({', '.join(config_groups(config_dirs))}) and {key} is not one: sweep its values with a "
            "comma list, range() or choice()")


def _is_culprit(line: str, err: Exception) -> bool:
    key = line.split("=", 1)[0].lstrip("+~")
    text = f"{err} {err.__cause__ or ''}"
    return f"'{key}" in text or f"{key}/" in text or f"full_key: {key}" in text
