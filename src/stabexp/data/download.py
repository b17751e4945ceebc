"""Corpora fetched on first use into the data cache, each file checked against a pinned SHA-256.

The cache is `$STABEXP_DATA` (default ~/.cache/stabexp/data); corpus NAME lives in
`$STABEXP_DATA/NAME/`. A folder that already holds every file is used as is, without the
network. A download goes to a temporary file next to its target and is renamed into place only
once complete and verified, so a failed, cut or corrupt transfer leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict

from stabexp.atomic import replacing
from stabexp.data.corpus import DataError, file_digest


def data_root() -> Path:
    default = Path.home() / ".cache" / "stabexp" / "data"
    return Path(os.environ.get("STABEXP_DATA") or default).expanduser().resolve()


@dataclass(frozen=True)
class RemoteCorpus:
    name: str                 # folder under the data cache
    url: str                  # base URL; a file's URL is url + its name
    files: Dict[str, str]     # file name -> SHA-256


# Multi30k task 1 (Elliott et al. 2016), raw text as published in github.com/multi30k/dataset:
# train 29,000 / val 1,014 / test_2016_flickr 1,000 sentence pairs, German and English.
MULTI30K = RemoteCorpus(
    name="multi30k",
    url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/",
    files={
        "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
        "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
        "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
        "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
        "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
        "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    },
)
CORPORA = {c.name: c for c in (MULTI30K,)}


def ensure_corpus(corpus: RemoteCorpus, root: Path, url: str = "") -> Path:
    """The folder root/corpus.name with every file of `corpus` in it, downloading what is
    missing from `url` (default corpus.url). Files already there are checked, not fetched."""
    folder = Path(root) / corpus.name
    existed = folder.exists()
    try:
        for name, sha256 in corpus.files.items():
            target = folder / name
            if target.is_file():
                got = file_digest(target)
                if got != sha256:
                    raise DataError(f"{target} has SHA-256 {got}, expected {sha256}: delete it to download it again")
                continue
            fetch(f"{url or corpus.url}{name}", target, sha256)
    except DataError:
        if not existed and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # a first download that fails leaves the cache as it found it
        raise
    return folder


def fetch(url: str, target: Path, sha256: str, timeout: float = 60.0) -> None:
    """Download url to target, verified against sha256; nothing is left at target (or next to
    it) unless the whole file arrived with the right checksum."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, received = hashlib.sha256(), 0
    try:
        # Renamed into place only when the block ends without an error: whole and verified.
        with urllib.request.urlopen(url, timeout=timeout) as response, replacing(target) as out:
            expected = response.headers.get("Content-Length")
            for chunk in iter(lambda: response.read(1 << 16), b""):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
            if expected is not None and received != int(expected):
                raise DataError(f"download of {url} was cut: {received} of {expected} bytes arrived")
            if digest.hexdigest() != sha256:
                raise DataError(f"{target.name} downloaded from {url} has SHA-256 {digest.hexdigest()}, "
                                f"expected {sha256}")
    except DataError:
        raise
    except urllib.error.HTTPError as err:
        raise DataError(f"download of {url} failed: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise DataError(f"download of {url} failed: {reason}") from None
