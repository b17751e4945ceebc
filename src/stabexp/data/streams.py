"""The base of the synthetic tasks: four independent batch streams seeded from the run's seed,
and evaluation on one fixed held-out batch."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from stabexp.data.task import Batch, Task, score
from stabexp.modes import eval_mode


class SeededStreams(Task):
    """Separate generators so that the training data, the init-time batch (Admin profiling, the
    gradient at init), the eval batch and the probe batch never depend on each other. A task
    defines `_make(n, generator) -> Batch`. The `n` arguments override the configured sizes
    (tests use them)."""

    same_eval_on_every_rank = True  # the one eval batch, scored whole on every rank

    def __init__(self, seed: int, batch_size: int = 64, eval_batch_size: int = 256,
                 probe_batch_size: int = 32, label_smoothing: float = 0.0):
        self._train = torch.Generator().manual_seed(seed * 4 + 0)
        self._init = torch.Generator().manual_seed(seed * 4 + 1)
        self._eval = torch.Generator().manual_seed(seed * 4 + 2)
        self._probe = torch.Generator().manual_seed(seed * 4 + 3)
        self.seed, self.batch_size, self.label_smoothing = seed, batch_size, label_smoothing
        self.eval_batch_size, self.probe_batch_size = eval_batch_size, probe_batch_size
        self._eval_batch: Optional[Batch] = None
        self._probe_batch: Optional[Batch] = None

    def _make(self, n: int, gen: torch.Generator) -> Batch:
        raise NotImplementedError

    def train_batch(self, n: Optional[int] = None) -> Batch:
        batch = self._make(n or self.batch_size, self._train)
        self.target_tokens += batch[2].numel()
        return batch

    def init_batch(self, n: Optional[int] = None) -> Batch:
        return self._make(n or self.batch_size, self._init)

    def eval_batch(self, n: Optional[int] = None) -> Batch:
        if n is not None:
            return self._make(n, self._eval)
        if self._eval_batch is None:
            self._eval_batch = self._make(self.eval_batch_size, self._eval)
        return self._eval_batch

    def probe_batch(self, n: Optional[int] = None) -> Batch:
        if n is not None:
            return self._make(n, self._probe)
        if self._probe_batch is None:
            self._probe_batch = self._make(self.probe_batch_size, self._probe)
        return self._probe_batch

    def state_dict(self) -> Dict:
        # The eval and probe batches are made once from their own seeds: nothing to keep.
        return {**super().state_dict(), "train": self._train.get_state(), "init": self._init.get_state()}

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        self._train.set_state(state["train"])
        self._init.set_state(state["init"])

    def evaluate(self, model, step: int = 0) -> Dict[str, float]:
        """Teacher-forced loss and token accuracy on the fixed held-out batch."""
        with eval_mode(model):
            nll, correct, tokens = score(model, [self.eval_batch()]).tolist()
        return {"eval_loss": nll / tokens, "eval_acc": correct / tokens}
