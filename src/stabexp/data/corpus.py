"""Parallel text on disk: one sentence per line, one file per split and language,
`{folder}/{split}.{lang}` or `{split}.{lang}.gz` (the layout of fairseq's prepare scripts and of
most MT corpora). Reading checks what would otherwise fail late or silently: a missing folder or
file, sides of different lengths, bytes that are not UTF-8, an empty split.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import List

from stabexp.errors import ConfigError


class DataError(ConfigError):
    """Bad input data: reported as one line (exit code 2), like a bad config value."""


def split_file(folder: Path, split: str, lang: str) -> Path:
    """`{split}.{lang}`, else `{split}.{lang}.gz`, in folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"task.path={folder} is not a folder: point it at the folder that holds "
                        f"{{split}}.{{lang}} files")
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (folder / name).is_file():
            return folder / name
    found = sorted(p.name for p in folder.iterdir() if p.is_file())
    raise DataError(f"no file {split}.{lang} (or {split}.{lang}.gz) in {folder}: it holds "
                    f"{', '.join(found[:8]) or 'no files'}{' ...' if len(found) > 8 else ''}")


def read_lines(path: Path) -> List[str]:
    """The lines of a text file (plain or gzip), without line ends; a line that is not UTF-8
    is an error naming the file and the line number."""
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    lines.append(raw.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError:
                    raise DataError(f"{path} line {number} is not UTF-8 text") from None
    except (OSError, EOFError) as err:  # a truncated or corrupt .gz
        raise DataError(f"cannot read {path}: {err}") from None
    return lines


@dataclass
class ParallelSplit:
    name: str
    src: List[str]
    tgt: List[str]
    src_file: Path
    tgt_file: Path


def read_split(folder: Path, split: str, src_lang: str, tgt_lang: str) -> ParallelSplit:
    src_file, tgt_file = split_file(folder, split, src_lang), split_file(folder, split, tgt_lang)
    src, tgt = read_lines(src_file), read_lines(tgt_file)
    if len(src) != len(tgt):
        raise DataError(f"{src_file} has {len(src)} lines but {tgt_file} has {len(tgt)}: "
                        "the two sides of a split must have one line per sentence pair")
    if not any(s.strip() and t.strip() for s, t in zip(src, tgt)):
        raise DataError(f"split {split!r} in {folder} has no sentence pair with text on both sides")
    return ParallelSplit(split, src, tgt, src_file, tgt_file)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
