"""Language modelling on real English text, for the single-stack models (model/lm.py).

The text: `task.path` a folder holding `{split}.txt` for the train / valid / test splits, or,
with no path, a built-in text that needs no download: the help topics of Python's standard
library (`pydoc_data.topics`, about 0.46 M characters of English prose with code examples),
joined in sorted topic order and cut at line ends into 90 / 5 / 5 % by characters.

Tokens: the subword machinery of translation (sentencepiece BPE or unigram, learned on the
training split, data/subwords.py) or characters (`task.subword=char`). Each line is encoded and
ends with EOS; the split is one token stream.

Objectives:
- decoder-only: next-token prediction on windows of seq_len + 1 tokens (input the first
  seq_len, targets the last seq_len), as nanoGPT;
- encoder-only: masked-LM (BERT, Devlin et al. 2019): each position is chosen with probability
  task.mask_prob, a chosen token becomes [MASK] 80 % of the time, a random token 10 %, itself
  10 %; only chosen positions are predicted (the others carry target IGNORE). [MASK] is one
  extra id after the tokenizer's vocabulary.
Training windows start at random positions of the training stream (seeded streams as the
synthetic tasks); validation and the probe batch are the first consecutive windows of the
validation stream; the test loss at the end covers the test stream's windows (up to
task.eval_batch_size of them).

A batch is (src, tgt_in, tgt_out) with an empty src (B, 0): the model reads tgt_in only.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Dict, List, Optional

import torch

from stabexp.data.corpus import DataError, read_lines
from stabexp.data.download import data_root
from stabexp.data.streams import SeededStreams
from stabexp.data.subwords import EOS, UNK, learn_or_load, tokenizer_caches
from stabexp.data.task import IGNORE, Batch, score, to_device
from stabexp.modes import eval_mode

ROLES = ("train", "valid", "test")
BUILTIN = "pydoc_data"  # the name summary.json gives the built-in text


def builtin_text() -> Dict[str, List[str]]:
    """The standard library's pydoc topics, split 90 / 5 / 5 % by characters at line ends."""
    from pydoc_data.topics import topics

    lines = [line for key in sorted(topics) for line in topics[key].splitlines()]
    total, cuts, seen, bounds = sum(len(x) + 1 for x in lines), (0.90, 0.95), 0, []
    for i, line in enumerate(lines):
        if len(bounds) < 2 and seen >= cuts[len(bounds)] * total:
            bounds.append(i)
        seen += len(line) + 1
    a, b = bounds
    return {"train": lines[:a], "valid": lines[a:b], "test": lines[b:]}


def folder_text(folder: Path, names: Dict[str, str]) -> Dict[str, List[str]]:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise DataError(f"task.path={folder} is not a folder: point it at the folder that holds "
                        f"{names['train']}.txt, {names['valid']}.txt and {names['test']}.txt")
    text = {}
    for role in ROLES:
        path = folder / f"{names[role]}.txt"
        if not path.is_file():
            raise DataError(f"no file {path.name} in {folder}: task=lm reads {{split}}.txt files")
        text[role] = read_lines(path)
        if not any(line.strip() for line in text[role]):
            raise DataError(f"{path} holds no text")
    return text


class Characters:
    """A character vocabulary learned from the training split: the specials of data/subwords.py
    at their ids (PAD, BOS, EOS, UNK), then every character seen, sorted."""

    def __init__(self, lines: List[str]):
        chars = sorted({ch for line in lines for ch in line})
        self.ids = {ch: i + 4 for i, ch in enumerate(chars)}
        self.path = None

    def __len__(self) -> int:
        return len(self.ids) + 4

    def encode(self, lines: List[str]) -> List[List[int]]:
        return [[self.ids.get(ch, UNK) for ch in line] for line in lines]


def tokenizer_for(t, train: List[str], source: str, files: List[Path]):
    if t.subword == "char":
        return Characters(train)
    # The built-in text has no file to hash: its digest goes into the cache name instead.
    name = source if files else f"{BUILTIN}-{hashlib.sha256(chr(10).join(train).encode()).hexdigest()[:12]}"
    return learn_or_load(files, train, name, ["text"], t.subword, t.vocab_size, tokenizer_caches(data_root()))


def stream(lines: List[str], tokenizer) -> torch.Tensor:
    """One token stream: each line's ids followed by EOS (empty lines too: paragraph breaks)."""
    ids: List[int] = []
    for encoded in tokenizer.encode(lines):
        ids.extend(encoded)
        ids.append(EOS)
    return torch.tensor(ids, dtype=torch.long)


def mask_tokens(tokens: torch.Tensor, mask_id: int, vocab: int, prob: float,
                gen: torch.Generator) -> Batch:
    """BERT's masking of (B, T) tokens: (input, targets) with targets IGNORE where not chosen."""
    chosen = torch.rand(tokens.shape, generator=gen) < prob
    roll = torch.rand(tokens.shape, generator=gen)
    random_ids = torch.randint(4, vocab, tokens.shape, generator=gen)  # never a special token
    masked = torch.where(chosen & (roll < 0.8), torch.full_like(tokens, mask_id), tokens)
    masked = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, masked)
    return masked, torch.where(chosen, tokens, torch.full_like(tokens, IGNORE))


class LanguageModelTask(SeededStreams):
    eval_columns = ("eval_loss", "eval_acc", "eval_ppl")

    def __init__(self, cfg, device: torch.device):
        t = cfg.task
        super().__init__(cfg.seed, batch_size=cfg.train.batch_size, eval_batch_size=t.eval_batch_size,
                         probe_batch_size=t.probe_batch_size, label_smoothing=cfg.train.label_smoothing)
        self.cfg, self.device, self.seq_len = t, device, t.seq_len
        self.masked = cfg.model.arch == "encoder_only"
        names = {"train": t.train_split, "valid": t.valid_split, "test": t.test_split}
        if t.path:
            self.source = str(Path(t.path).expanduser().resolve())
            text = folder_text(Path(self.source), names)
            files = [Path(self.source) / f"{names['train']}.txt"]
        else:
            self.source, text, files = BUILTIN, builtin_text(), []
        self.tokenizer = tokenizer_for(t, text["train"], Path(self.source).name, files)
        self.streams = {role: stream(text[role], self.tokenizer) for role in ROLES}
        window = self.seq_len + (0 if self.masked else 1)
        for role, ids in self.streams.items():
            if len(ids) < window + 1:
                raise DataError(f"the {role} split has {len(ids)} tokens: fewer than one window of "
                                f"task.seq_len={self.seq_len} (+1); lower task.seq_len or add text")
        # Encoder-only: one id after the tokenizer's for [MASK].
        self.mask_id = len(self.tokenizer) if self.masked else None
        self.vocab_size = len(self.tokenizer) + (1 if self.masked else 0)
        self.max_positions = self.seq_len
        self.mask_prob = t.mask_prob

    @property
    def chance_loss(self) -> float:
        return math.log(self.vocab_size)

    # --- batches ----------------------------------------------------------------------------

    def _batch(self, windows: torch.Tensor, gen: Optional[torch.Generator]) -> Batch:
        if self.masked:
            tgt_in, tgt_out = mask_tokens(windows, self.mask_id, len(self.tokenizer), self.mask_prob, gen)
        else:
            tgt_in, tgt_out = windows[:, :-1], windows[:, 1:]
        src = torch.empty(windows.shape[0], 0, dtype=torch.long)
        return tuple(to_device(x.contiguous(), self.device) for x in (src, tgt_in, tgt_out))

    def _make(self, n: int, gen: torch.Generator) -> Batch:
        ids, window = self.streams["train"], self.seq_len + (0 if self.masked else 1)
        starts = torch.randint(0, len(ids) - window + 1, (n,), generator=gen)
        return self._batch(ids[starts[:, None] + torch.arange(window)], gen)

    def _windows(self, role: str, n: int) -> torch.Tensor:
        """The first n consecutive (non-overlapping) windows of a split (fewer if it is short)."""
        ids, window = self.streams[role], self.seq_len + (0 if self.masked else 1)
        count = min(n, (len(ids) - 1) // self.seq_len)
        starts = torch.arange(count) * self.seq_len
        return ids[starts[:, None] + torch.arange(window)]

    def eval_batch(self, n: Optional[int] = None) -> Batch:
        if self._eval_batch is None:
            gen = torch.Generator().manual_seed(self.seed * 4 + 2)
            self._eval_batch = self._batch(self._windows("valid", self.eval_batch_size), gen)
        return self._eval_batch

    def probe_batch(self, n: Optional[int] = None) -> Batch:
        if self._probe_batch is None:
            gen = torch.Generator().manual_seed(self.seed * 4 + 3)
            self._probe_batch = self._batch(self._windows("valid", self.probe_batch_size), gen)
        return self._probe_batch

    # --- evaluation -------------------------------------------------------------------------

    def _scores(self, model, batch: Batch) -> Dict[str, float]:
        with eval_mode(model):
            nll, correct, tokens = score(model, [batch]).tolist()
        loss = nll / tokens
        return {"loss": loss, "acc": correct / tokens, "ppl": math.exp(min(loss, 700.0))}

    def evaluate(self, model, step: int = 0) -> Dict[str, float]:
        """Loss (nats per predicted token), accuracy and perplexity on the validation windows."""
        s = self._scores(model, self.eval_batch())
        return {"eval_loss": s["loss"], "eval_acc": s["acc"], "eval_ppl": s["ppl"]}

    def finish(self, model, out_dir: Path) -> Dict:
        gen = torch.Generator().manual_seed(self.seed * 4 + 2)
        s = self._scores(model, self._batch(self._windows("test", self.eval_batch_size), gen))
        return {"test_loss": s["loss"], "test_ppl": s["ppl"], "test_acc": s["acc"]}

    def unigram_loss(self) -> float:
        """The validation loss of the unigram model of the training stream (each token's
        frequency, whatever the context): the plateau of a model that has learnt only how often
        tokens occur, a second reference line besides the chance loss."""
        counts = torch.bincount(self.streams["train"], minlength=self.vocab_size).double()
        log_p = (counts.clamp(min=0.5) / counts.sum()).log()  # an unseen token: half a count
        targets = self.eval_batch()[2].cpu().flatten()
        targets = targets[targets != IGNORE]
        return float(-log_p[targets].mean())

    def info(self) -> Dict:
        t = self.cfg
        return {"data": {"text": self.source, "tokens": {role: len(ids) for role, ids in self.streams.items()},
                         "subword": t.subword, "vocab_size": self.vocab_size,
                         "tokenizer": str(self.tokenizer.path) if self.tokenizer.path else None,
                         "seq_len": self.seq_len,
                         "objective": f"masked LM (p={self.mask_prob})" if self.masked else "next token",
                         "eval_windows": int(self.eval_batch()[1].shape[0]),
                         "unigram_eval_loss": self.unigram_loss()}}
