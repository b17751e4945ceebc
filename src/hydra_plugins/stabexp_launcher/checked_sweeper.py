"""The `checked` sweeper (hydra/sweeper=checked, the default; its config node: conf.py): Hydra's
basic sweeper, less its own composition of every job's config before the first job starts
(`validate_batch_is_legal`). `stabexp run` has composed and checked the config of every value of
every swept key before Hydra starts (stabexp.preflight), and the launcher composes each job's
config to run it (the packed launcher all of a batch's before it starts one), so that third
composition, a fraction of a second per job, only delayed a sweep's start (by minutes for a
thousand seeds). Only Hydra is imported here, as in the launcher's module."""

from __future__ import annotations

from typing import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class CheckedBasicSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Nothing: stabexp.preflight has checked the sweep, and the launcher composes each job."""
