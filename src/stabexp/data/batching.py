"""Variable-length batches of sentence pairs: length bucketing under a token budget (fairseq's
`--max-tokens`) and/or a sentence count (`--batch-size`), and right-padding into tensors."""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from stabexp.data.task import Batch, to_device


def length_batches(src_lens: torch.Tensor, tgt_lens: torch.Tensor, max_tokens: int, max_sentences: int,
                   generator: torch.Generator) -> List[torch.Tensor]:
    """One epoch of batches (index tensors), as fairseq forms them: shuffle, stable-sort by
    target then source length (so ties come in random order), cut the sorted order into
    batches whose padded size, longest pair x pairs, stays within max_tokens (0: no token
    budget) and whose pair count stays within max_sentences (0: no count limit); then shuffle
    the batches. A pair's size is max(source, target) length in tokens, specials included."""
    order = torch.randperm(len(src_lens), generator=generator)
    order = order[torch.argsort(tgt_lens[order], stable=True)]
    order = order[torch.argsort(src_lens[order], stable=True)]
    sizes = torch.maximum(src_lens, tgt_lens)[order].tolist()
    batches, start, longest = [], 0, 0
    for i, size in enumerate(sizes):
        count = i - start + 1
        if count > 1 and ((max_tokens and max(longest, size) * count > max_tokens) or
                          (max_sentences and count > max_sentences)):
            batches.append(order[start:i])
            start, longest = i, 0
        longest = max(longest, size)
    batches.append(order[start:])
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


class BatchStream:
    """Endless batches of a training split, epoch after epoch, each epoch re-shuffled from
    the stream's own generator."""

    def __init__(self, src_lens: torch.Tensor, tgt_lens: torch.Tensor, max_tokens: int, max_sentences: int,
                 seed: int):
        self.src_lens, self.tgt_lens = src_lens, tgt_lens
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.generator = torch.Generator().manual_seed(seed)
        self._batches: List[torch.Tensor] = []

    def __next__(self) -> torch.Tensor:
        if not self._batches:  # a new epoch (the corpus checks rule out an empty split)
            self._batches = length_batches(self.src_lens, self.tgt_lens, self.max_tokens, self.max_sentences,
                                           self.generator)[::-1]
        return self._batches.pop()

    def state_dict(self) -> Dict:
        """The generator and what is left of the current epoch, for a checkpoint."""
        return {"generator": self.generator.get_state(), "batches": [b.clone() for b in self._batches]}

    def load_state_dict(self, state: Dict) -> None:
        self.generator.set_state(state["generator"])
        self._batches = list(state["batches"])


def collate(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], bos: int, eos: int, pad: int,
            device: torch.device) -> Batch:
    """Right-padded (src, tgt_in, tgt_out): the source ends with EOS (as in fairseq), tgt_in is
    BOS + target, tgt_out is target + EOS."""
    tgt_in = _padded([[bos, *t] for t in tgt], pad)
    tgt_out = _padded([[*t, eos] for t in tgt], pad)
    return sources(src, eos, pad, device), to_device(tgt_in, device), to_device(tgt_out, device)


def sources(src: Sequence[Sequence[int]], eos: int, pad: int, device: torch.device) -> torch.Tensor:
    """Right-padded source ids, each ending with EOS."""
    return to_device(_padded([[*s, eos] for s in src], pad), device)


def _padded(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out
