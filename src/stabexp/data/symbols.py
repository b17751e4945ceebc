"""Seq2seq tasks over a small alphabet, generated in-process from the seed.

Token 0 is BOS; the source is seq_len symbols drawn uniformly from 1..vocab_size-1. Each target
position, pooled over positions, is then uniform too, so a model that has learnt nothing sits at
the chance loss ln(vocab_size - 1) on either task.

- sort (the default task): the target is the source in ascending order. Each next symbol follows
  from the source's contents and the symbol just emitted (content-based cross-attention), as a
  word's translation follows from the source's words.
- reverse: the target is the source read backwards. Each target position must attend to one
  mirrored source position, which only the position encodings tell apart (position-based
  cross-attention). DeepNorm, Post-LN-init and ReZero inside Post-LN sit for 1000+ steps at
  loss 1.94 here, the loss of predicting the source's symbol counts at every position
  (docs/results.md, "Why DeepNorm stalls on the reversal task").
"""

from __future__ import annotations

import math

import torch

from stabexp.data.streams import Batch, SeededStreams
from stabexp.data.task import to_device

BOS = 0


class SymbolTask(SeededStreams):
    """A task defines `target(src)`: the target sequence of each source row."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, device: torch.device, **sizes):
        super().__init__(seed, **sizes)
        self.vocab_size, self.seq_len, self.device = vocab_size, seq_len, device

    @property
    def chance_loss(self) -> float:
        return math.log(self.vocab_size - 1)

    @staticmethod
    def target(src: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _make(self, n: int, gen: torch.Generator) -> Batch:
        src = torch.randint(1, self.vocab_size, (n, self.seq_len), generator=gen)
        tgt_out = self.target(src)
        tgt_in = torch.cat([torch.full((n, 1), BOS, dtype=src.dtype), tgt_out[:, :-1]], dim=1)
        return tuple(to_device(t, self.device) for t in (src, tgt_in, tgt_out))


class SortTask(SymbolTask):
    @staticmethod
    def target(src: torch.Tensor) -> torch.Tensor:
        return src.sort(dim=1).values


class ReverseTask(SymbolTask):
    @staticmethod
    def target(src: torch.Tensor) -> torch.Tensor:
        return src.flip(1)


SYMBOL_TASKS = {"sort": SortTask, "reverse": ReverseTask}
