"""Machine translation on parallel text from disk (`task=translation`) or downloaded on first use
(`task=multi30k`): joint subwords, length-bucketed batches, validation loss / perplexity /
BLEU at eval steps, and test BLEU with the translations saved at the end of a completed run.

BLEU is sacreBLEU's corpus score (default 13a tokenisation, mixed case) of detokenised
hypotheses against the raw reference lines, the way WMT scores are reported (Post 2018).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

from stabexp.data.batching import BatchStream, collate, sources
from stabexp.data.corpus import DataError, ParallelSplit, read_split
from stabexp.data.download import CORPORA, data_root, ensure_corpus
from stabexp.data.subwords import BOS, EOS, PAD, Subwords, learn_or_load, tokenizer_caches
from stabexp.data.task import Task, token_stats
from stabexp.model.generate import beam_search, greedy, max_output_len

ROLES = ("train", "valid", "test")


@dataclass
class Corpus:
    folder: Path
    splits: Dict[str, ParallelSplit]   # by role: train, valid, test
    subwords: Subwords


def corpus_folder(task_cfg) -> Path:
    """task.path when set, else the download cache's copy of task.download (fetched if missing)."""
    if task_cfg.path:
        return Path(task_cfg.path).expanduser().resolve()
    return ensure_corpus(CORPORA[task_cfg.download], data_root(), task_cfg.url)


def load_corpus(task_cfg) -> Corpus:
    """Read and check the three splits and learn (or load) the subword vocabulary. Raises
    DataError before anything is written when the data or the vocabulary size is bad."""
    folder = corpus_folder(task_cfg)
    names = {"train": task_cfg.train_split, "valid": task_cfg.valid_split, "test": task_cfg.test_split}
    splits = {role: read_split(folder, names[role], task_cfg.src_lang, task_cfg.tgt_lang) for role in ROLES}
    train = splits["train"]
    subwords = learn_or_load([train.src_file, train.tgt_file], [*train.src, *train.tgt],
                             task_cfg.download or folder.name, [task_cfg.src_lang, task_cfg.tgt_lang],
                             task_cfg.subword, task_cfg.vocab_size, tokenizer_caches(data_root()))
    return Corpus(folder, splits, subwords)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacreBLEU's corpus BLEU with its default settings (those of `bleu_signature`)."""
    from sacrebleu.metrics import BLEU

    return BLEU().corpus_score(list(hypotheses), [list(references)]).score


def bleu_signature() -> str:
    """The signature of corpus_bleu's scores: its settings, one reference, sacreBLEU's version."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    bleu.corpus_score(["."], [["."]])  # sacreBLEU learns the number of references from a scoring
    return str(bleu.get_signature())


class TranslationTask(Task):
    def __init__(self, cfg, device: torch.device):
        t, tr = cfg.task, cfg.train
        self.cfg, self.device = t, device
        self.label_smoothing = tr.label_smoothing
        self.corpus = corpus = load_corpus(t)
        self.subwords = corpus.subwords
        self.vocab_size, self.pad_id = len(self.subwords), PAD
        self.max_positions = t.max_len + 2  # BOS/EOS plus the longest kept (or truncated) side
        self._counts: Dict[str, Dict[str, int]] = {}
        self.train_src, self.train_tgt = self._encode("train", drop=True)
        self.valid_src, self.valid_tgt = self._encode("valid", drop=False)
        self.test_src, self.test_tgt = self._encode("test", drop=False)
        if not self.train_src:
            raise DataError(f"every training pair of {corpus.splits['train'].src_file.parent} is longer than "
                            f"task.max_len={t.max_len} subwords on a side or empty: raise task.max_len")
        lens = [torch.tensor([len(x) + 1 for x in side]) for side in (self.train_src, self.train_tgt)]
        # Streams seeded as the synthetic tasks' (data/streams.py): training and init batches apart.
        self._train = BatchStream(*lens, tr.max_tokens, tr.batch_size, cfg.seed * 4 + 0)
        self._init = BatchStream(*lens, tr.max_tokens, tr.batch_size, cfg.seed * 4 + 1)
        order = sorted(range(len(self.valid_src)), key=lambda i: (len(self.valid_src[i]), len(self.valid_tgt[i])))
        self.valid_batches = [self._collate(self.valid_src, self.valid_tgt, order[i:i + t.eval_batch_size])
                              for i in range(0, len(order), t.eval_batch_size)]
        # The probes' fixed input x: the first validation pairs.
        self._probe = self._collate(self.valid_src, self.valid_tgt, range(min(t.probe_batch_size, len(self.valid_src))))
        n_bleu = t.bleu_sentences or len(self.valid_src)
        self.bleu_indices = list(range(min(n_bleu, len(self.valid_src))))

    # --- data ------------------------------------------------------------------------------

    def _encode(self, role: str, drop: bool) -> Tuple[List[List[int]], List[List[int]]]:
        """Subword ids of a split. Training pairs with an empty side or a side over max_len are
        dropped; validation and test keep every pair (their scores cover the whole split), a side
        over max_len being cut to it."""
        split, limit = self.corpus.splits[role], self.cfg.max_len
        src, tgt = self.subwords.encode(split.src), self.subwords.encode(split.tgt)
        counts = {"pairs_in_files": len(src)}
        if drop:
            empty = [not s or not t for s, t in zip(src, tgt)]
            long = [not e and (len(s) > limit or len(t) > limit) for e, s, t in zip(empty, src, tgt)]
            keep = [i for i in range(len(src)) if not empty[i] and not long[i]]
            counts.update(dropped_empty=sum(empty), dropped_long=sum(long))
            src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
        else:
            counts["truncated"] = sum(len(s) > limit or len(t) > limit for s, t in zip(src, tgt))
            src, tgt = [s[:limit] for s in src], [t[:limit] for t in tgt]
        counts.update(pairs=len(src), src_tokens=sum(map(len, src)), tgt_tokens=sum(map(len, tgt)))
        self._counts[role] = counts
        return src, tgt

    def _collate(self, src, tgt, indices):
        indices = list(indices)
        return collate([src[i] for i in indices], [tgt[i] for i in indices], BOS, EOS, PAD, self.device)

    def train_batch(self):
        indices = next(self._train).tolist()
        self.target_tokens += sum(len(self.train_tgt[i]) + 1 for i in indices)  # + EOS
        return self._collate(self.train_src, self.train_tgt, indices)

    def init_batch(self):
        return self._collate(self.train_src, self.train_tgt, next(self._init).tolist())

    def probe_batch(self):
        return self._probe

    @property
    def chance_loss(self) -> float:
        return math.log(self.vocab_size)

    def info(self) -> Dict:
        c = self.cfg
        return {"data": {"corpus": str(self.corpus.folder), "src_lang": c.src_lang, "tgt_lang": c.tgt_lang,
                         "splits": {role: {"name": self.corpus.splits[role].name, **self._counts[role]}
                                    for role in ROLES},
                         "tokenizer": str(self.subwords.path), "subword": c.subword, "vocab_size": self.vocab_size,
                         "max_len": c.max_len, "valid_bleu_sentences": len(self.bleu_indices),
                         "decoding": "greedy" if c.beam == 1 else f"beam {c.beam}"},
                "bleu_signature": bleu_signature()}

    # --- evaluation -----------------------------------------------------------------------

    @torch.no_grad()
    def _scores(self, model, batches) -> Dict[str, float]:
        nll, correct, tokens = torch.stack([token_stats(model, self, b) for b in batches]).sum(0).tolist()
        loss = nll / tokens
        return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "acc": correct / tokens}

    @torch.no_grad()
    def translate(self, model, src: Sequence[Sequence[int]]) -> List[str]:
        """Detokenised translations of source id lists, in their order (batched by length)."""
        order = sorted(range(len(src)), key=lambda i: len(src[i]))
        out: List[List[int]] = [[] for _ in src]
        size = self.cfg.eval_batch_size
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            x = sources([src[i] for i in chunk], EOS, PAD, self.device)
            limit = max_output_len(x.shape[1], self.max_positions)
            if self.cfg.beam > 1:
                ids = beam_search(model, x, BOS, EOS, PAD, limit, self.cfg.beam)
            else:
                ids = greedy(model, x, BOS, EOS, PAD, limit)
            for i, hyp in zip(chunk, ids):
                out[i] = hyp
        return self.subwords.decode(out)

    def evaluate(self, model, step: int = 0) -> Dict[str, float]:
        """Loss, perplexity and token accuracy on the whole validation split (teacher-forced,
        no label smoothing), and BLEU of the translations of its first bleu_sentences, after
        the first update (an untrained model's BLEU is 0 and its translations all run to the
        length limit: the most expensive decoding of a run, for nothing)."""
        was_training = model.training
        model.eval()
        try:
            s = self._scores(model, self.valid_batches)
            row = {"eval_loss": s["loss"], "eval_ppl": s["ppl"], "eval_acc": s["acc"]}
            if self.bleu_indices and step > 0:
                hyps = self.translate(model, [self.valid_src[i] for i in self.bleu_indices])
                refs = [self.corpus.splits["valid"].tgt[i] for i in self.bleu_indices]
                row["valid_bleu"] = corpus_bleu(hyps, refs)
        finally:
            model.train(was_training)
        return row

    def finish(self, model, out_dir: Path) -> Dict:
        """Test loss, perplexity and BLEU of the whole test split; its translations go to
        out_dir/test_translations.tsv (source, hypothesis, reference per line)."""
        was_training = model.training
        model.eval()
        try:
            order = sorted(range(len(self.test_src)), key=lambda i: len(self.test_src[i]))
            size = self.cfg.eval_batch_size
            s = self._scores(model, [self._collate(self.test_src, self.test_tgt, order[i:i + size])
                                     for i in range(0, len(order), size)])
            hyps = self.translate(model, self.test_src)
        finally:
            model.train(was_training)
        test = self.corpus.splits["test"]
        bleu = corpus_bleu(hyps, test.tgt)
        path = Path(out_dir) / "test_translations.tsv"
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n")
            writer.writerow(["source", "hypothesis", "reference"])
            writer.writerows(zip(test.src, hyps, test.tgt))
        return {"test_loss": s["loss"], "test_ppl": s["ppl"], "test_acc": s["acc"], "test_bleu": bleu,
                "test_translations": path.name}
