"""Translation corpora through Hugging Face `datasets` (`task.hf_dataset`), written once as the
`{split}.{lang}` files the translation task reads from a folder (data/corpus.py).

A source is a dataset id of the Hugging Face hub (`load_dataset(id, task.hf_config,
revision=task.hf_revision)`), a folder saved with `save_to_disk` (`load_from_disk`), or a folder
of json / csv / parquet data files (`load_dataset(folder)`). Rows hold either a `translation`
dict {lang: text} (the WMT datasets) or one column per language.

The task's split names (task.train_split / valid_split / test_split) map onto the dataset's: the
exact name when the dataset has it, else the first alias it has ("valid" -> "validation", "dev",
...). The files take the task's names, so the folder reads like any task.path folder, and
everything after it (length filter, subwords and their cache, batches, BLEU) is unchanged.

The folder is `$STABEXP_DATA/hf/<id>/<config>/<revision>/` for a hub id ('default' and 'main'
when unset) and `$STABEXP_DATA/hf/local/<name>-<fingerprint>/<config>/` for a local folder, the
fingerprint hashing its path and its files' sizes and times, so that a changed folder is
written again. Each file is written to a temporary name and renamed into place when whole
(stabexp.atomic): processes that write it at once, or a kill, leave whole files only. A run that
finds every file it needs reads them without importing `datasets`. Every check (the dataset
loads, the splits and languages exist) runs before the first file is written: a bad value is
one error line and writes nothing here.
"""

from __future__ import annotations

import hashlib
import re
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from stabexp.atomic import replacing
from stabexp.errors import ConfigError, install_hint

INSTALL = install_hint("hf")
ROLES = {"train": "train_split", "valid": "valid_split", "test": "test_split"}
# The names datasets give one split. A dataset's own split of the task's name comes first (one
# with both "valid" and "validation" gives "valid"), then the first of the others it has.
ALIASES = (("train", "training"),
           ("valid", "validation", "dev", "val", "development"),
           ("test", "testing"))
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
BATCH_ROWS = 10_000  # rows read per step: a WMT training split never sits in memory as Python strings


@dataclass(frozen=True)
class Source:
    name: str                 # task.hf_dataset as given
    folder: Optional[Path]    # a local folder, or None for a hub id
    config: Optional[str]
    revision: Optional[str]

    @property
    def saved(self) -> bool:
        """A folder written by Dataset(Dict).save_to_disk, read with load_from_disk."""
        return self.folder is not None and any((self.folder / f).is_file()
                                               for f in ("dataset_dict.json", "state.json"))


def source(task_cfg) -> Source:
    """Where task.hf_dataset points: a local folder when one exists there, else a hub id."""
    # str(): a config or a short sha of digits only would otherwise arrive as a number.
    name = str(task_cfg.hf_dataset)
    config, revision = (str(v) if v not in (None, "") else None for v in (task_cfg.hf_config, task_cfg.hf_revision))
    folder = Path(name).expanduser()
    if folder.is_dir():
        src = Source(name, folder.resolve(), config, revision)
        if revision:
            raise ConfigError(f"task.hf_revision={revision}: a revision is a commit of a hub repository, "
                              f"and task.hf_dataset={name} is a local folder: leave task.hf_revision empty")
        if config and src.saved:
            raise ConfigError(f"task.hf_config={config}: {name} is a folder saved with save_to_disk, which "
                              "has no configurations: leave task.hf_config empty")
        return src
    if not HUB_ID.match(name) or ".." in name:
        raise ConfigError(f"task.hf_dataset={name} is neither a folder nor a dataset id of the Hugging Face "
                          "hub (owner/name, e.g. wmt/wmt14)")
    return Source(name, None, config, revision)


def _safe(part: Optional[str], unset: str) -> str:
    """A folder name for a config or revision (a branch such as refs/convert/parquet has '/')."""
    if not part:
        return unset
    return re.sub(r"[^\w.-]", "_", part).lstrip(".") or "_"


def _fingerprint(folder: Path) -> str:
    """Hash of a local folder's path and its files' names, sizes and modification times: cheap,
    and it changes when the dataset there is written again."""
    h = hashlib.sha256(str(folder).encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        h.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:12]


def cache_folder(src: Source, root: Path) -> Path:
    """The folder the source's {split}.{lang} files are written to under the data cache."""
    base = Path(root) / "hf"
    if src.folder is not None:
        entry = f"{_safe(src.folder.name, 'dataset')}-{_fingerprint(src.folder)}"
        return base / "local" / entry / _safe(src.config, "default")
    return base.joinpath(*src.name.split("/")) / _safe(src.config, "default") / _safe(src.revision, "main")


def corpus_name(task_cfg) -> str:
    """A short readable name for the corpus (the tokenizer cache's file names start with it)."""
    src = source(task_cfg)
    stem = src.folder.name if src.folder is not None else src.name.split("/")[-1]
    return "-".join(_safe(p, "") for p in (stem, src.config) if p)


def materialise(task_cfg, root: Path) -> Path:
    """The folder holding `{split}.{lang}` for the task's three splits and two languages,
    written from the dataset when a file is missing. Raises ConfigError, writing nothing, when
    `datasets` is missing, the dataset cannot be loaded, or a split or language is not there."""
    src = source(task_cfg)
    folder = cache_folder(src, root)
    langs = (task_cfg.src_lang, task_cfg.tgt_lang)
    wanted = {role: getattr(task_cfg, key) for role, key in ROLES.items()}
    if all((folder / f"{name}.{lang}").is_file() for name in wanted.values() for lang in langs):
        return folder  # written by an earlier run: no need for `datasets`
    splits = _load(src)
    plan = []  # (the task's name, the dataset's split, its layout): all checked before writing
    for role, name in wanted.items():
        split = dataset_split(ROLES[role], name, list(splits), src.name)
        plan.append((name, split, layout(splits[split], langs, src.name, split)))
    folder.mkdir(parents=True, exist_ok=True)
    for name, split, rows_hold in plan:
        _write(folder, name, langs, sentence_pairs(splits[split], rows_hold, langs))
    return folder


def _datasets(name: str):
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"task.hf_dataset={name} needs the Hugging Face datasets package, which is not "
                          f"installed: {INSTALL}") from None
    return datasets


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0].rstrip(".")


def hub_unreachable(timeout: float = 5.0) -> Optional[str]:
    """Why the Hugging Face hub cannot be reached from here (None: it can, or the hub is off by
    HF_HUB_OFFLINE / HF_DATASETS_OFFLINE and datasets reads its cache only). One connection
    attempt within `timeout` (through the proxy where one is set): without it the hub's client
    retries with back-off for half a minute before it gives up."""
    import socket
    import time
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    from huggingface_hub import constants

    if _hub_off():
        return None
    url = urlsplit(constants.ENDPOINT)
    proxies = getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not proxy_bypass(url.hostname):
        url = urlsplit(proxy if "//" in proxy else f"http://{proxy}")
    port = url.port or (443 if url.scheme == "https" else 80)
    deadline, error = time.monotonic() + timeout, None
    try:
        addresses = socket.getaddrinfo(url.hostname, port, type=socket.SOCK_STREAM)
    except OSError as err:
        return f"{url.hostname}:{port}: {_first_line(err)}"
    for family, kind, proto, _, address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(left)
            try:
                sock.connect(address)
                return None
            except OSError as err:
                error = err
    return f"{url.hostname}:{port}: {_first_line(error) if error else f'no answer within {timeout:g} s'}"


def _load(src: Source) -> Dict:
    """The dataset's splits by name (a mapping of datasets.Dataset)."""
    datasets = _datasets(src.name)
    if not src.folder:
        why = hub_unreachable()
        if why:
            raise ConfigError(f"task.hf_dataset={src.name} cannot be loaded: the Hugging Face hub cannot be reached "
                              f"({why}); with the dataset in the datasets cache set HF_HUB_OFFLINE=1 to read it "
                              "from there, or give a folder saved with save_to_disk or of json / csv / parquet files")
    try:
        if src.saved:
            loaded = datasets.load_from_disk(str(src.folder))
        elif src.folder is not None:
            loaded = datasets.load_dataset(str(src.folder), src.config)
        else:
            loaded = datasets.load_dataset(src.name, src.config, revision=src.revision)
    except Exception as err:  # the library's many ways to refuse a source, each one line for the user
        raise _load_error(src, err) from None
    return loaded if isinstance(loaded, dict) else {"train": loaded}  # one Dataset saved alone


def _load_error(src: Source, err: Exception) -> ConfigError:
    reason = _first_line(err)
    if isinstance(err, ValueError) and "config" in reason.lower():
        listed = re.search(r"\[(.*?)\]", str(err))  # the list may follow on a later line
        configs = listed.group(1).replace("'", "") if listed else ""
        problem = "has no such configuration" if src.config else "needs a configuration"
        return ConfigError(f"task.hf_config={src.config}: {src.name} {problem}"
                           + (f"; it has {configs}" if configs else f" ({reason})"))
    if "scripts are no longer supported" in reason:
        if src.folder is not None:
            return ConfigError(f"task.hf_dataset={src.name} holds a loading script, which datasets no longer "
                               "runs: save the data as json / csv / parquet files, or with save_to_disk")
        return ConfigError(f"task.hf_dataset={src.name} at revision {src.revision or 'main'} is a dataset with a "
                           "loading script, which datasets no longer runs: pin a task.hf_revision that holds "
                           "data files (parquet), or use a copy saved as data files")
    offline = " (HF_HUB_OFFLINE is set: only the datasets cache is read)" if _hub_off() else ""
    return ConfigError(f"task.hf_dataset={src.name} cannot be loaded ({reason}){offline}: give a dataset id of the "
                       "Hugging Face hub that can be reached from here, a folder saved with save_to_disk, or "
                       "a folder of json / csv / parquet files")


def _hub_off() -> bool:
    """The hub turned off for the client (HF_HUB_OFFLINE) or for datasets (HF_DATASETS_OFFLINE too)."""
    import datasets
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE)


def dataset_split(key: str, wanted: str, available: Sequence[str], name: str) -> str:
    """The dataset's split for the task's split name `wanted` (task.<key>): the same name, else
    the first alias of it the dataset has."""
    if wanted in available:
        return wanted
    lowered = {s.lower(): s for s in available}
    for group in ALIASES:
        if wanted.lower() in group:
            for alias in group:
                if alias in lowered:
                    return lowered[alias]
    raise ConfigError(f"task.{key}={wanted}: {name} has no such split (nor another name for it); "
                      f"its splits are {', '.join(available) or 'none'}")


def layout(split, langs: Sequence[str], name: str, split_name: str) -> str:
    """'translation' when the rows hold a {lang: text} dict in that column, 'columns' when each
    language has a column of its own; a language the rows lack is an error naming those they hold."""
    if "translation" in split.column_names:
        feature = split.features["translation"]
        if type(feature).__name__ == "TranslationVariableLanguages":  # rows of {language: [...], translation: [...]}
            raise ConfigError(f"task.hf_dataset={name}: its rows hold a different set of languages each "
                              "(TranslationVariableLanguages); give a dataset with a fixed pair of languages")
        held = list(getattr(feature, "languages", None) or (feature.keys() if isinstance(feature, dict) else []))
        kind, what = "translation", "languages"
    else:
        held, kind, what = list(split.column_names), "columns", "columns"
    for key, lang in zip(("src_lang", "tgt_lang"), langs):
        if lang not in held:
            raise ConfigError(f"task.{key}={lang}: the rows of {name} (split {split_name}) hold no {lang!r} text; "
                              f"their {what} are {', '.join(map(str, held)) or 'none'}")
    return kind


def _one_line(text) -> str:
    """A sentence as one line of a text file: a line break inside it would shift every line
    after it against the other side's file."""
    return " ".join(str(text).splitlines()) if text is not None else ""


def sentence_pairs(split, rows_hold: str, langs: Sequence[str]) -> Iterator[Tuple[str, ...]]:
    """The split's sentences in the given languages, one tuple per row, in the dataset's order."""
    columns = ["translation"] if rows_hold == "translation" else list(langs)
    for batch in split.select_columns(columns).iter(batch_size=BATCH_ROWS):
        if rows_hold == "translation":
            for pair in batch["translation"]:
                yield tuple(_one_line(pair.get(lang)) for lang in langs)
        else:
            yield from zip(*([_one_line(t) for t in batch[lang]] for lang in langs))


def _write(folder: Path, split: str, langs: Sequence[str], pairs: Iterator[Tuple[str, ...]]) -> None:
    """`{split}.{lang}` for each language, in one pass over the rows; each file is renamed into
    place only once whole (a failure leaves the files as they were)."""
    with ExitStack() as stack:
        outs: List = [stack.enter_context(replacing(folder / f"{split}.{lang}")) for lang in langs]
        for pair in pairs:
            for out, text in zip(outs, pair):
                out.write(text.encode("utf-8") + b"\n")
