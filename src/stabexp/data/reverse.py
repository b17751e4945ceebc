"""Sequence reversal: target = the source read backwards.

Token 0 is BOS; symbols are 1..vocab_size-1, drawn uniformly, so a model that has learnt nothing
sits at the chance loss ln(vocab_size - 1). Solving it needs cross-attention to the mirrored
position, which makes it a small but real seq2seq problem.
"""

from __future__ import annotations

import math

import torch

from stabexp.data.streams import Batch, SeededStreams
from stabexp.data.task import to_device

BOS = 0


class ReverseTask(SeededStreams):
    def __init__(self, vocab_size: int, seq_len: int, seed: int, device: torch.device, **sizes):
        super().__init__(seed, **sizes)
        self.vocab_size, self.seq_len, self.device = vocab_size, seq_len, device

    @property
    def chance_loss(self) -> float:
        return math.log(self.vocab_size - 1)

    def _make(self, n: int, gen: torch.Generator) -> Batch:
        src = torch.randint(1, self.vocab_size, (n, self.seq_len), generator=gen)
        tgt_out = src.flip(1)
        tgt_in = torch.cat([torch.full((n, 1), BOS, dtype=src.dtype), tgt_out[:, :-1]], dim=1)
        return tuple(to_device(t, self.device) for t in (src, tgt_in, tgt_out))
