"""What the trainer asks of a task, and nothing more (fairseq's split between task and model):
batches, the training loss, the eval columns at eval steps, and what a finished run reports.

A task of a user's own subclasses Task, takes (cfg, device) in its constructor and names the
model archs it trains in `archs` (docs/plugins.md).

A batch is (src, tgt_in, tgt_out), token ids of shape (B, S), (B, T), (B, T): tgt_in is the
target shifted right behind BOS, tgt_out the tokens to predict. A task with variable-length
batches pads them with `pad_id` on the right; the loss and the probes skip those positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from stabexp import distributed

Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]
IGNORE = -100  # a target that is not predicted (masked LM's unmasked positions): PyTorch's ignore_index


class Task:
    vocab_size: int                # token ids are 0 .. vocab_size - 1
    pad_id: Optional[int] = None   # None: fixed-length batches, no padding anywhere
    label_smoothing: float = 0.0   # of the training loss only; eval losses are plain NLL
    max_positions: int = 512       # the longest sequence the model must embed
    target_tokens: int = 0         # real target tokens in the training batches drawn so far
    eval_columns: Tuple[str, ...] = ("eval_loss", "eval_acc")  # what `evaluate` returns
    # The model.arch values the task trains: what a Task subclass given as a plug-in declares
    # (stabexp.plugins; the built-ins' factories in data/__init__.py declare theirs with `trains`).
    archs: Tuple[str, ...] = ()
    # Whether `evaluate` runs the same forwards on every one of K processes (a fixed held-out
    # batch): then FSDP2 gathers the model layer by layer for it, else whole (ranks score shares).
    same_eval_on_every_rank: bool = False

    @property
    def chance_loss(self) -> float:
        """The loss of a model that predicts the uniform distribution over the outputs."""
        raise NotImplementedError

    def train_batch(self) -> Batch:
        raise NotImplementedError

    def init_batch(self) -> Batch:
        """A training-like batch from a stream of its own (Admin's profiling, the gradient at
        init), so that using it does not shift the training batches."""
        raise NotImplementedError

    def probe_batch(self) -> Batch:
        """The fixed input x of the probes, the same at every call."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        """The training loss: cross-entropy, mean over real target tokens (padding ignored),
        label-smoothed (Szegedy et al. 2016; fairseq's label_smoothed_cross_entropy)."""
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), label_smoothing=self.label_smoothing,
                               ignore_index=IGNORE if self.pad_id is None else self.pad_id)

    def loss_sum(self, logits: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        """`loss` summed instead of averaged over the real target tokens: on K processes each
        rank's share of a batch contributes its sum over the whole batch's count, which adds up
        to the one-process mean (stabexp.distributed)."""
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), label_smoothing=self.label_smoothing,
                               ignore_index=IGNORE if self.pad_id is None else self.pad_id, reduction="sum")

    def predicted(self, tgt_out: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the target positions the loss counts (not padding, not IGNORE)."""
        return tgt_out != (IGNORE if self.pad_id is None else self.pad_id)

    def evaluate(self, model, step: int = 0) -> Dict[str, float]:
        """The eval columns of metrics.csv (`eval_columns`) for the model after `step` updates."""
        raise NotImplementedError

    def eval_loss(self, model) -> float:
        """The eval loss alone, as `evaluate` measures it (no decoding: what the layer-importance
        probe asks for once per layer)."""
        return self.evaluate(model)["eval_loss"]

    def summarise_eval(self, row: Dict[str, float], summary: Dict) -> None:
        """Fold an eval row into the run's summary, beyond the eval loss and accuracy every task
        has (the trainer keeps those)."""

    def finish(self, model, out_dir: Path) -> Dict:
        """After a completed run: extra summary fields (and files in out_dir)."""
        return {}

    def info(self) -> Dict:
        """What summary.json records about the data (sizes, what was dropped, the vocabulary)."""
        return {}

    def state_dict(self) -> Dict:
        """Where the task's batch streams stand, for a checkpoint (train/checkpoint.py): a
        resumed run draws the batches the uninterrupted run would have drawn."""
        return {"target_tokens": self.target_tokens}

    def load_state_dict(self, state: Dict) -> None:
        self.target_tokens = state["target_tokens"]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch tensor made on the CPU, on `device`: on CUDA through pinned memory and without
    blocking, so feeding a batch does not stall the host behind the GPU's queue."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@torch.no_grad()
def score(model, batches: Sequence[Batch]) -> torch.Tensor:
    """`token_stats` summed over `batches`. On K processes each rank scores its rows of every
    batch and the three totals are summed across the ranks (one collective), so every rank
    gets the whole split's numbers (stabexp.distributed). Ranks run different forwards here (a
    rank without rows of a batch skips it): under FSDP only inside `distributed.full_weights`,
    as every caller in the trainer is."""
    stats = [token_stats(model, part) for part in map(distributed.rows, batches) if part[1].shape[0]]
    total = torch.stack(stats).sum(0) if stats else torch.zeros(3, device=batches[0][1].device)
    return distributed.sum_(total)


@torch.no_grad()
def token_stats(model, batch: Batch) -> torch.Tensor:
    """(summed NLL, correct predictions, real target tokens) of one batch, teacher-forced, on
    device: callers add batches up and sync once."""
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)
    nll = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), reduction="none")
    real = model.feature_mask(src, tgt_in)
    real = (tgt_out.flatten() != IGNORE).float() if real is None else real.flatten().float()
    correct = (logits.argmax(-1).flatten() == tgt_out.flatten()).float() * real
    return torch.stack([(nll * real).sum(), correct.sum(), real.sum()])
