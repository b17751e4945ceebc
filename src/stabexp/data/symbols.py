"""Seq2seq tasks over a small alphabet, generated in-process from the seed.

Token 0 is BOS; the source is seq_len symbols drawn uniformly from 1..vocab_size-1. Each target
position, pooled over positions, is then uniform too, so a model that has learnt nothing sits at
the chance loss ln(vocab_size - 1) on either task.

- sort (the default task): the target is the source in ascending order. Each next symbol follows
  from the source's contents and the symbol just emitted (content-based cross-attention), as a
  word's translation follows from the source's words.
- reverse: the target is the source read backwards. Each target position must attend to one
  mirrored source position, which only the position encodings tell apart (position-based
  cross-attention). DeepNorm sits here at loss 1.94, the loss of predicting the source's symbol
  counts at every position, until about step 2000 at 6L-6L (Post-LN-init and ReZero inside
  Post-LN too, from 18L-18L on): docs/results.md, "Why DeepNorm stalls on the reversal task".
"""

from __future__ import annotations

import math
from typing import Dict

import torch
import torch.nn.functional as F

from stabexp.data.streams import Batch, SeededStreams
from stabexp.data.task import to_device

BOS = 0
RULE_SEED = 12345  # the sample that estimates rule_losses' position frequencies, apart from the run's streams


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

    def rule_losses(self, sample: int = 20000) -> Dict[str, float]:
        """Eval loss and token accuracy of two rules that stop short of the task, reference
        lines beside chance. position_only: each target position's symbol frequencies (from
        `sample` sequences of a stream of their own), ignoring the source; source_counts: every
        symbol's share of the source at every position, ignoring position (the plateau DeepNorm
        sits on in reversal). Accuracy takes the most likely symbol, ties to the smallest."""
        src, _, tgt_out = (t.cpu() for t in self.eval_batch())
        held = self._make(sample, torch.Generator().manual_seed(RULE_SEED))[2].cpu()
        counts = F.one_hot(held, self.vocab_size).sum(0).double()              # (T, V)
        log_p = (counts.clamp(min=0.5) / counts.sum(-1, keepdim=True)).log()  # unseen: half a count
        share = F.one_hot(src, self.vocab_size).double().mean(1)              # (B, V)
        out = {}
        for rule, log_q in (("position_only", log_p.expand(len(src), -1, -1)),
                            ("source_counts", share.log()[:, None].expand(-1, self.seq_len, -1))):
            out[f"{rule}_eval_loss"] = float(-log_q.gather(2, tgt_out[..., None]).mean())
            out[f"{rule}_eval_acc"] = float((log_q.argmax(-1) == tgt_out).double().mean())
        return out

    def info(self) -> Dict:
        return {"data": {"vocab_size": self.vocab_size, "seq_len": self.seq_len, **self.rule_losses()}}


class SortTask(SymbolTask):
    @staticmethod
    def target(src: torch.Tensor) -> torch.Tensor:
        return src.sort(dim=1).values


class ReverseTask(SymbolTask):
    @staticmethod
    def target(src: torch.Tensor) -> torch.Tensor:
        return src.flip(1)


SYMBOL_TASKS = {"sort": SortTask, "reverse": ReverseTask}
