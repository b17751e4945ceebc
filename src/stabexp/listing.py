"""`stabexp list`: the control groups, the experiment presets with what each costs, and the
plug-ins found, read from the config folders (built-in and the user's) and the entry points."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import yaml

from stabexp.config import ConfigError
from stabexp.paths import conf_dir, outputs_dir
from stabexp.paths import config_files, user_config_dirs
from stabexp.preflight import parse_command


def _preset_description(path: Path) -> str:
    """The first comment line of a preset file after `# @package`: what it reproduces."""
    lines = [line[1:].strip() for line in path.read_text().splitlines()
             if line.startswith("#") and "@package" not in line]
    return lines[0] if lines else ""


LIST_USAGE = """usage: stabexp list [--config-dir DIR]
  the control groups (group=NAME), the experiment presets (experiment=NAME) with what each costs,
  and the plug-ins found; --config-dir adds a folder of your own groups and presets"""


def main(args: List[str] = ()) -> int:
    from stabexp.presets import line as cost_line

    if {"-h", "--help"} & set(args):
        print(LIST_USAGE)
        return 0
    try:
        command = parse_command(list(args))  # as `stabexp run` reads --config-dir and hydra.searchpath
        user_dirs = user_config_dirs(command.config_dir, command.overrides)
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    rows = []
    for path in config_files("group", user_dirs):
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
    presets = config_files("experiment", user_dirs)
    width = max((len(p.stem) for p in presets), default=0)
    print("\nExperiment presets (stabexp run experiment=NAME [scale=quick]; all: make reproduce):")
    for path in presets:
        print(f"  {path.stem:<{width}}  {_preset_description(path)}")
        said = cost_line(path)
        if said is not None:
            print(f"  {'':<{width}}  cost: {said}")
    # Plug-ins (docs/plugins.md): other packages' entry points, read without importing them,
    # and the groups whose placement or init rule is a dotted path to a user's module.
    from stabexp import plugins

    found = plugins.plugins()
    if found:
        width = max(len(f"{p.kind} {p.name}") for p in found)
        print("\nPlug-ins of other packages (entry points):")
        for p in found:
            print(f"  {f'{p.kind} {p.name}':<{width}}  {p.value}  [{p.distribution}]")
    dotted = []
    for path in config_files("group", user_dirs):
        g = yaml.safe_load(path.read_text()) or {}
        keys = [f"{key}: {g[key]}" for key in ("residual", "encoder_residual", "decoder_residual", "init")
                if plugins.is_dotted_path(g.get(key))]
        if keys:
            dotted.append((g.get("name", path.stem), ", ".join(keys), path))
    if dotted:
        width = max(len(name) for name, *_ in dotted)
        print("\nGroups with a plug-in (a dotted path, imported from PYTHONPATH when the group runs):")
        for name, keys, path in dotted:
            print(f"  {name:<{width}}  {keys}  ({path})")
    print(f"\nConfigs: {', '.join(str(d) for d in (conf_dir(), *user_dirs))}; run folders: {outputs_dir()}")
    return 0



