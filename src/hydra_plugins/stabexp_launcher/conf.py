"""The `packed` launcher's config node (hydra/launcher=packed) and the `checked` sweeper's
(hydra/sweeper=checked), stored when this module is imported. Apart from the launcher so that stabexp.config can store it before any compose without
importing the launcher, which imports the sweep's machinery: Hydra's scan of hydra_plugins misses
an editable install's folder (a path hook, not a folder)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeperConf
from hydra.core.config_store import ConfigStore


@dataclass
class PackedLauncherConf:
    _target_: str = "hydra_plugins.stabexp_launcher.packed_launcher.PackedLauncher"
    jobs: Optional[int] = None     # jobs at a time at most; null: as the cores and memory allow
    threads: Optional[int] = None  # torch threads per job; null: train.threads, else the cores
                                   # shared out among the jobs that run at once


ConfigStore.instance().store(group="hydra/launcher", name="packed", node=PackedLauncherConf, provider="stabexp")


@dataclass
class CheckedSweeperConf(BasicSweeperConf):  # max_batch_size and params, as hydra/sweeper=basic
    _target_: str = "hydra_plugins.stabexp_launcher.checked_sweeper.CheckedBasicSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="checked", node=CheckedSweeperConf, provider="stabexp")
