"""Whose a run folder is: the resolved config it was started with (its config.yaml, and the copy
in its checkpoint), a fingerprint of that config, and the code versions that ran it.

A run into a folder that holds another config's run is refused in one line naming the keys
that differ, whatever state that run is in: the folder never mixes two configs, and never
answers "already completed" with another config's results. A newer stabexp takes over an older
folder (a finished run is left as it is, an unfinished one resumes) when every key added to the
schema since takes the value that reproduces what runs did before the key existed: its schema
default, unless BEFORE_ADDED names another. overwrite=true replaces the folder's run instead.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

import yaml
from omegaconf import DictConfig, OmegaConf

from stabexp.atomic import write_atomic
from stabexp.config import ConfigError, resolved, with_defaults
from stabexp.paths import project_root

CONFIG = "config.yaml"
# What says how a run is handled, not what it computes: what to do with the folder, where the
# run is watched, and the text `stabexp list` shows.
NOT_COMPARED = ("overwrite", "logger", "group.description", "group.citation")
# Keys whose schema default is not what runs did before the key existed, with the value that
# is. A change that adds a key whose default changes what a run computes adds it here.
BEFORE_ADDED: Dict[str, object] = {}


def run_files() -> tuple:
    """The files a run writes into its folder (besides Hydra's .hydra/ and log): what
    overwrite=true removes, so that the replaced run leaves nothing behind; each built-in probe's
    own files among them (probes/builtin.py, imported here so that reading a folder's config
    does not import torch)."""
    from stabexp.probes.builtin import PROBES

    return ("summary.json", CONFIG, "metrics.csv", "layers.csv", *(name for probe in PROBES.values() for name in probe.files),
            "model.pt", "error.txt", "test_translations.tsv")


def flat(tree, prefix: str = "") -> Dict[str, object]:
    """{dotted key: leaf value} of a nested dict (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: Dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def compared(plain: Dict) -> Dict[str, object]:
    keys = flat(plain)
    return {k: v for k, v in keys.items() if not any(k == n or k.startswith(n + ".") for n in NOT_COMPARED)}


def fingerprint(cfg: DictConfig) -> str:
    """A short hash of what the run computes (its resolved config, NOT_COMPARED aside)."""
    text = json.dumps(compared(resolved(cfg, leave_out=())), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def code_version() -> str:
    """stabexp's version, and the commit when it runs from a git checkout (`+dirty` with
    uncommitted changes)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("stabexp")
    except PackageNotFoundError:
        release = "unknown"
    root = project_root()
    if root is None or not (root / ".git").exists():
        return release
    try:
        described = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty=+dirty",
                                    "--abbrev=12", "--exclude=*"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        described = ""
    return f"{release}+g{described}" if described else release


def differences(recorded: Dict, cfg: DictConfig) -> List[str]:
    """The keys whose values differ between a folder's recorded config (plain, as config.yaml
    holds it) and this run's, each as `key: X in the folder, Y here`. A key added to the schema since
    the folder was written counts as its schema default there (BEFORE_ADDED aside)."""
    current = compared(resolved(cfg, leave_out=()))
    written = compared(recorded)
    gone = sorted(set(written) - set(current))
    kept = {k: v for k, v in flat(recorded).items() if k in current or k not in written}
    try:
        then = compared(resolved(with_defaults(OmegaConf.create(_nested(kept))), leave_out=()))
    except Exception:  # a value today's schema refuses: compare as written
        then = dict(written)
    for key, value in BEFORE_ADDED.items():
        if key not in written and key in then:
            then[key] = value
    changed = [k for k in current if then.get(k, _ABSENT) != current[k]]
    return ([f"{k}: {_show(then.get(k, _ABSENT))} in the folder, {_show(current[k])} here" for k in changed]
            + [f"{k}: {_show(written[k])} in the folder, no longer a key" for k in gone])


_ABSENT = object()


def _show(value) -> str:
    return "absent" if value is _ABSENT else json.dumps(value, default=str)


def _nested(keys: Dict[str, object]) -> Dict:
    tree: Dict = {}
    for dotted, value in keys.items():
        node = tree
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def recorded_config(out_dir: Path) -> Optional[Dict]:
    """The resolved config a folder's run started with; None for a folder without one (new,
    or written by a version that kept only Hydra's .hydra/config.yaml)."""
    path = Path(out_dir) / CONFIG
    if not path.exists():
        return None
    try:
        recorded = yaml.safe_load(path.read_text()) or {}
    except (ValueError, yaml.YAMLError) as err:  # not YAML, or not text
        recorded = err
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path} is not a run's config ({str(recorded).splitlines()[0][:100]}): run with "
                          "overwrite=true to replace the folder's run") from None
    return recorded


def refusal(out_dir: Path, changes: List[str], what: str = "a run of another config") -> str:
    shown = "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")
    return (f"{out_dir} holds {what} ({shown}): give this run its own folder, or overwrite=true to "
            "replace that run")


def refused(out_dir: Path, cfg: DictConfig) -> Optional[str]:
    """The one line refusing this run the folder, which holds a run of another config (or a
    config.yaml that is not one); None when the run may use it (overwrite: it replaces that run)."""
    if cfg.overwrite:
        return None
    try:
        recorded = recorded_config(out_dir)
    except ConfigError as err:
        return str(err)
    changes = differences(recorded, cfg) if recorded is not None else []
    return refusal(Path(out_dir), changes) if changes else None


def clear(out_dir: Path) -> None:
    """Remove the files of the folder's previous run (overwrite=true), a plug-in probe's CSV
    files among them."""
    for name in run_files():
        (Path(out_dir) / name).unlink(missing_ok=True)
    for path in Path(out_dir).glob("*.csv"):
        path.unlink()


def write_hydra_record(out_dir: Path, cfg: DictConfig) -> None:
    """Hydra's record of the command (.hydra/config.yaml, hydra.yaml, overrides.yaml) for the
    task config `cfg`, written once the folder is known to be this run's: stabexp.app turns
    Hydra's own writing off, which comes before the task starts and would overwrite the record
    of a folder the run is then refused."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.instance().cfg  # {"hydra": ...}
    if hydra_cfg is None:
        return
    folder = Path(out_dir) / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", hydra_cfg),
                       ("overrides.yaml", hydra_cfg.hydra.overrides.task)):
        text = OmegaConf.to_yaml(node).encode()
        write_atomic(folder / name, lambda f: f.write(text))
