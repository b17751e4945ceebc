"""Machine translation on parallel text from disk (`task=translation`), downloaded on first use
(`task=multi30k`) or written once from a Hugging Face dataset (`task.hf_dataset`, data/hf.py):
joint subwords, length-bucketed batches, validation loss / perplexity / BLEU at eval steps, and
test BLEU with the translations saved at the end of a completed run.

BLEU is sacreBLEU's corpus score (default 13a tokenisation, mixed case) of detokenised
hypotheses against the raw reference lines, the way WMT scores are reported (Post 2018).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import torch

from stabexp import distributed
from stabexp.data.batching import BatchStream, collate, sources
from stabexp.data.corpus import DataError, ParallelSplit, read_split
from stabexp.data.download import CORPORA, data_root, ensure_corpus
from stabexp.data.subwords import BOS, EOS, PAD, Subwords, learn_or_load, tokenizer_caches
from stabexp.data.task import Task, score
from stabexp.modes import eval_mode
from stabexp.model.generate import beam_search, greedy, max_output_len

ROLES = ("train", "valid", "test")


@dataclass
class EncodedSplit:
    text: ParallelSplit                # the lines as read (references are scored against these)
    src: List[List[int]]               # subword ids, one list per kept pair
    tgt: List[List[int]]
    counts: Dict[str, int] = field(default_factory=dict)  # for summary.json


@dataclass
class Corpus:
    folder: Path
    subwords: Subwords
    splits: Dict[str, EncodedSplit]    # by role: train, valid, test


def corpus_folder(task_cfg) -> Path:
    """task.path when set; the files written from task.hf_dataset (once, data/hf.py); else the
    download cache's copy of task.download (fetched if missing)."""
    if task_cfg.path:
        return Path(task_cfg.path).expanduser().resolve()
    if task_cfg.hf_dataset:
        from stabexp.data.hf import materialise  # `datasets` itself only when files are missing

        return materialise(task_cfg, data_root())
    return ensure_corpus(CORPORA[task_cfg.download], data_root(), task_cfg.url)


def corpus_name(task_cfg, folder: Path) -> str:
    """The name the tokenizer cache files start with: the download's, the dataset's, the folder's."""
    if task_cfg.download:
        return task_cfg.download
    if task_cfg.hf_dataset:
        from stabexp.data.hf import corpus_name as hf_name

        return hf_name(task_cfg)
    return folder.name


def load_corpus(task_cfg) -> Corpus:
    """Read and check the three splits, learn (or load) the subword vocabulary and encode. Raises
    DataError (ConfigError for a bad task.hf_*) before anything but the download, the files
    written from a Hugging Face dataset and the tokenizer cache is written."""
    folder = corpus_folder(task_cfg)
    names = {"train": task_cfg.train_split, "valid": task_cfg.valid_split, "test": task_cfg.test_split}
    text = {role: read_split(folder, names[role], task_cfg.src_lang, task_cfg.tgt_lang) for role in ROLES}
    train = text["train"]
    by_lang = {task_cfg.src_lang: train.src, task_cfg.tgt_lang: train.tgt}
    subwords = learn_or_load([train.src_file, train.tgt_file],
                             [line for lang in sorted(by_lang) for line in by_lang[lang]],  # either direction alike
                             corpus_name(task_cfg, folder), sorted(by_lang), task_cfg.subword,
                             task_cfg.vocab_size, tokenizer_caches(data_root()))
    splits = {role: _encode(text[role], subwords, task_cfg.max_len, drop=role == "train") for role in ROLES}
    if not splits["train"].src:
        raise DataError(f"every training pair of {folder} is empty on a side or longer than "
                        f"task.max_len={task_cfg.max_len} subwords: raise task.max_len")
    return Corpus(folder, subwords, splits)


def _encode(split: ParallelSplit, subwords: Subwords, limit: int, drop: bool) -> EncodedSplit:
    """Subword ids of a split. Training pairs with an empty side or a side over `limit` are
    dropped; validation and test keep every pair (their scores cover the whole split), a side
    over the limit being cut to it."""
    src, tgt = subwords.encode(split.src), subwords.encode(split.tgt)
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
    return EncodedSplit(split, src, tgt, counts)


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


def by_length(lengths: Sequence[int], size: int) -> Iterator[List[int]]:
    """Indices in order of length, in chunks of `size`: batches with little padding."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return (order[i:i + size] for i in range(0, len(order), size))


class TranslationTask(Task):
    eval_columns = ("eval_loss", "eval_acc", "eval_ppl", "valid_bleu")

    def __init__(self, cfg, device: torch.device):
        t, tr = cfg.task, cfg.train
        self.cfg, self.device = t, device
        self.label_smoothing = tr.label_smoothing
        self.corpus = load_corpus(t)
        self.subwords = self.corpus.subwords
        self.train, self.valid, self.test = (self.corpus.splits[role] for role in ROLES)
        self.vocab_size, self.pad_id = len(self.subwords), PAD
        self.max_positions = t.max_len + 1  # the longest kept (or cut) side, plus BOS or EOS
        # Lengths with EOS (or BOS): what a pair takes in a batch, and the targets it predicts.
        self._src_lens = torch.tensor([len(x) + 1 for x in self.train.src])
        self._tgt_lens = torch.tensor([len(x) + 1 for x in self.train.tgt])
        # Streams seeded as the synthetic tasks' (data/streams.py): training and init batches apart.
        self._train = BatchStream(self._src_lens, self._tgt_lens, tr.max_tokens, tr.batch_size, cfg.seed * 4 + 0)
        self._init = BatchStream(self._src_lens, self._tgt_lens, tr.max_tokens, tr.batch_size, cfg.seed * 4 + 1)
        self.valid_batches = [self._collate(self.valid, chunk)
                              for chunk in by_length([len(s) for s in self.valid.src], t.eval_batch_size)]
        # The probes' fixed input x: the first validation pairs.
        self._probe = self._collate(self.valid, range(min(t.probe_batch_size, len(self.valid.src))))
        self.bleu_indices = (list(range(min(t.bleu_sentences or len(self.valid.src), len(self.valid.src))))
                             if t.bleu else [])

    # --- data ------------------------------------------------------------------------------

    def _collate(self, split: EncodedSplit, indices):
        indices = list(indices)
        return collate([split.src[i] for i in indices], [split.tgt[i] for i in indices], BOS, EOS, PAD, self.device)

    def train_batch(self):
        indices = next(self._train)
        self.target_tokens += int(self._tgt_lens[indices].sum())
        return self._collate(self.train, indices.tolist())

    def state_dict(self) -> Dict:
        return {**super().state_dict(), "train": self._train.state_dict(), "init": self._init.state_dict()}

    def load_state_dict(self, state: Dict) -> None:
        super().load_state_dict(state)
        self._train.load_state_dict(state["train"])
        self._init.load_state_dict(state["init"])

    def init_batch(self):
        return self._collate(self.train, next(self._init).tolist())

    def probe_batch(self):
        return self._probe

    @property
    def chance_loss(self) -> float:
        return math.log(self.vocab_size)

    def info(self) -> Dict:
        c = self.cfg
        return {"data": {"corpus": str(self.corpus.folder), "src_lang": c.src_lang, "tgt_lang": c.tgt_lang,
                         "splits": {role: {"name": split.text.name, **split.counts}
                                    for role, split in self.corpus.splits.items()},
                         "tokenizer": str(self.subwords.path), "subword": c.subword, "vocab_size": self.vocab_size,
                         "max_len": c.max_len, "valid_bleu_sentences": len(self.bleu_indices),
                         "decoding": "greedy" if c.beam == 1 else f"beam {c.beam}",
                         "max_len_a": c.max_len_a, "max_len_b": c.max_len_b},
                "bleu_signature": bleu_signature()}

    # --- evaluation -----------------------------------------------------------------------

    def _scores(self, model, batches) -> Dict[str, float]:
        nll, correct, tokens = score(model, batches).tolist()
        loss = nll / tokens
        return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "acc": correct / tokens}

    @torch.no_grad()
    def translate(self, model, src: Sequence[Sequence[int]]) -> List[str]:
        """Detokenised translations of source id lists, in their order (batched by length). On
        K processes each rank decodes every K-th sentence and the translations are gathered."""
        if distributed.world() > 1:
            mine = self._translate(model, distributed.share_of(src))
            return distributed.in_order(distributed.gather(mine), len(src))
        return self._translate(model, src)

    def _translate(self, model, src: Sequence[Sequence[int]]) -> List[str]:
        out: List[List[int]] = [[] for _ in src]
        for chunk in by_length([len(s) for s in src], self.cfg.eval_batch_size):
            x = sources([src[i] for i in chunk], EOS, PAD, self.device)
            # Each sentence's own limit, so a degenerate hypothesis ("A A A ...") of a short
            # source stops early instead of running to the batch's longest limit.
            limit = max_output_len((x != PAD).sum(1), self.max_positions, self.cfg.max_len_a, self.cfg.max_len_b)
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
        with eval_mode(model):
            s = self._scores(model, self.valid_batches)
            row = {"eval_loss": s["loss"], "eval_ppl": s["ppl"], "eval_acc": s["acc"]}
            if self.bleu_indices and step > 0:
                hyps = self.translate(model, [self.valid.src[i] for i in self.bleu_indices])
                row["valid_bleu"] = corpus_bleu(hyps, [self.valid.text.tgt[i] for i in self.bleu_indices])
        return row

    def eval_loss(self, model) -> float:
        with eval_mode(model):
            return self._scores(model, self.valid_batches)["loss"]

    def summarise_eval(self, row: Dict[str, float], summary: Dict) -> None:
        summary["final_eval_ppl"] = row["eval_ppl"]
        if "valid_bleu" in row:
            summary["valid_bleu"] = row["valid_bleu"]
            summary["best_valid_bleu"] = max(row["valid_bleu"], summary.get("best_valid_bleu") or 0.0)

    def finish(self, model, out_dir: Path) -> Dict:
        """Test loss, perplexity and BLEU of the whole test split; its translations go to
        out_dir/test_translations.tsv (source, hypothesis, reference per line). With
        task.bleu=false, the losses only."""
        test = self.test
        with eval_mode(model):
            s = self._scores(model, [self._collate(test, chunk)
                                     for chunk in by_length([len(x) for x in test.src], self.cfg.eval_batch_size)])
            scores = {"test_loss": s["loss"], "test_ppl": s["ppl"], "test_acc": s["acc"]}
            if not self.cfg.bleu:
                return scores
            hyps = self.translate(model, test.src)
        path = Path(out_dir) / "test_translations.tsv"
        if distributed.is_rank0():  # on K processes every rank has the gathered translations
            with open(path, "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f, delimiter="\t", lineterminator="\n")
                writer.writerow(["source", "hypothesis", "reference"])
                writer.writerows(zip(test.text.src, hyps, test.text.tgt))
        return {**scores, "test_bleu": corpus_bleu(hyps, test.text.tgt), "test_translations": path.name}
