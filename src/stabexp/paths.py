"""Where stabexp finds its configs and writes its runs: the built-in config folder, the user's
config folders a command line adds (Hydra's search path), the config groups and their files, and
the outputs folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

from stabexp.errors import ConfigError


def project_root() -> Optional[Path]:
    """The checkout that holds conf/ when stabexp runs from one (editable install); None for a
    plain install."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "conf").is_dir() and (here / "src" / "stabexp").is_dir() else None


def conf_dir() -> Path:
    """The built-in configs: $STABEXP_CONF, else the checkout's conf/, else the copy that ships
    inside the package (stabexp/conf, pyproject.toml's package-dir). Users add their own config
    folders the Hydra way (--config-dir, hydra.searchpath), never by editing these."""
    if os.environ.get("STABEXP_CONF"):
        return Path(os.environ["STABEXP_CONF"]).resolve()
    root = project_root()
    return (root / "conf") if root is not None else Path(__file__).resolve().parent / "conf"


def outputs_dir() -> Path:
    """Where every run folder goes: $STABEXP_OUTPUTS, else the checkout's outputs/, else
    ./outputs of the working directory (a plain install)."""
    if os.environ.get("STABEXP_OUTPUTS"):
        return Path(os.environ["STABEXP_OUTPUTS"]).resolve()
    root = project_root()
    return ((root if root is not None else Path.cwd()) / "outputs").resolve()


def user_config_dirs(config_dir: Optional[str], hydra_overrides: List[str]) -> List[Path]:
    """The folders a command line adds to Hydra's config search path: `--config-dir DIR` (or
    -cd) and the file:// entries of `hydra.searchpath=[...]` (pkg:// entries are modules)."""
    dirs = [config_dir] if config_dir else []
    for a in hydra_overrides:
        if a.lstrip("+").startswith("hydra.searchpath="):
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


def config_groups(config_dirs: List[Path] = ()) -> List[str]:
    """The config groups (group=, model=, task=, ...): the folders of the config search path."""
    return sorted({d.name for root in (conf_dir(), *config_dirs) for d in root.iterdir()
                   if d.is_dir() and any(d.glob("*.yaml"))})
