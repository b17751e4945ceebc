"""A joint subword vocabulary (BPE or unigram, SentencePiece) learned on a corpus's training split.

Cached as `<cache>/<corpus>.<lang>-<lang>.<kind><size>.<key>.model`, where the key hashes the
training files' bytes, the settings and the library's version: the runs of a sweep share one
tokenizer, and the languages are sorted, so De-En and En-De share it too. The cache is
`$STABEXP_DATA/tokenizers`, or ~/.cache/stabexp/tokenizers when that cannot be written (a
shared read-only data folder).

Learning is deterministic (the same bytes twice) and happens in memory; the model file is
written to a temporary name and renamed into place, so jobs of a parallel sweep that start
together and all learn it write the same file, each rename atomic: there is nothing to race.
A vocabulary size the library refuses is one error line and writes nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Iterable, List, Sequence

from stabexp.atomic import write_atomic
from stabexp.data.corpus import DataError, file_digest

# Special tokens, fixed ids: padding, begin and end of sentence, unknown.
PAD, BOS, EOS, UNK = 0, 1, 2, 3
KINDS = ("bpe", "unigram")


def tokenizer_caches(data_root: Path) -> List[Path]:
    """Where tokenizers are looked for, and written to the first that takes the file."""
    return [Path(data_root) / "tokenizers", Path.home() / ".cache" / "stabexp" / "tokenizers"]


class Subwords:
    """Encode sentences to ids and decode ids back to detokenised text."""

    def __init__(self, model_bytes: bytes, path: Path):
        import sentencepiece as spm

        self.path = path
        self.sp = spm.SentencePieceProcessor(model_proto=model_bytes)
        assert (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id()) == (PAD, BOS, EOS, UNK)

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, lines: Sequence[str]) -> List[List[int]]:
        return self.sp.encode(list(lines))

    def decode(self, ids: Sequence[Sequence[int]]) -> List[str]:
        return self.sp.decode([list(x) for x in ids])


def learn_or_load(train_files: Iterable[Path], train_lines: Iterable[str], name: str, langs: Sequence[str],
                  kind: str, vocab_size: int, caches: Sequence[Path]) -> Subwords:
    """The cached tokenizer for these training files and settings, learning it from
    `train_lines` (both sides of the training split) when it is not cached yet."""
    import sentencepiece as spm

    settings = {"kind": kind, "vocab_size": vocab_size, "langs": sorted(langs),
                "sentencepiece": spm.__version__, "character_coverage": 1.0}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in sorted(train_files, key=lambda p: p.name):
        key.update(file_digest(path).encode())
    file_name = f"{name}.{'-'.join(sorted(langs))}.{kind}{vocab_size}.{key.hexdigest()[:12]}.model"
    for cache in caches:
        if (Path(cache) / file_name).is_file():
            return Subwords((Path(cache) / file_name).read_bytes(), Path(cache) / file_name)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([line for line in train_lines if line.strip()]), model_writer=model,
            model_type=kind, vocab_size=vocab_size, character_coverage=1.0,
            pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK,
            # Fixed: unigram's pieces depend on the thread count, and both kinds record it.
            num_threads=4, minloglevel=2)
    except RuntimeError as err:
        # "INTERNAL: src/...cc(744) [check] Vocabulary size too high (9000). Please set ..."
        reason = re.sub(r"^.*?\] ", "", str(err).strip().splitlines()[0])
        raise DataError(f"task.vocab_size={vocab_size} is refused by sentencepiece ({kind}) on "
                        f"this corpus: {reason}") from None
    data = model.getvalue()
    for cache in caches:
        try:
            return Subwords(data, _write_atomically(Path(cache) / file_name, data))
        except OSError as err:
            failure = err
    raise DataError(f"cannot write the tokenizer to {' or '.join(map(str, caches))}: {failure}")


def _write_atomically(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: f.write(data))
    return path
