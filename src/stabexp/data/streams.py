"""The four independent batch streams every task draws from, seeded from the run's seed."""

from __future__ import annotations

from typing import Tuple

import torch

Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class SeededStreams:
    """Separate generators so that the training data, the init-time batch (Admin profiling, the
    gradient at init), the eval batch and the probe batch never depend on each other. A task
    defines `_make(n, generator) -> Batch`."""

    def __init__(self, seed: int):
        self._train = torch.Generator().manual_seed(seed * 4 + 0)
        self._init = torch.Generator().manual_seed(seed * 4 + 1)
        self._eval = torch.Generator().manual_seed(seed * 4 + 2)
        self._probe = torch.Generator().manual_seed(seed * 4 + 3)

    def _make(self, n: int, gen: torch.Generator) -> Batch:
        raise NotImplementedError

    def train_batch(self, n: int) -> Batch:
        return self._make(n, self._train)

    def init_batch(self, n: int) -> Batch:
        return self._make(n, self._init)

    def eval_batch(self, n: int) -> Batch:
        return self._make(n, self._eval)

    def probe_batch(self, n: int) -> Batch:
        return self._make(n, self._probe)
