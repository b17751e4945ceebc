"""Translation corpora through Hugging Face `datasets` (task.hf_dataset, data/hf.py): a dataset
saved with save_to_disk and a folder of json lines, written once as {split}.{lang} files that
equal the dataset's rows, read by the rest of the pipeline as a task.path folder would be; the
second load without `datasets`; the one-line errors. No network: the hub is offline in every
test, and the Hugging Face caches live under the test's tmp_path."""

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import one_line_error
from corpus import SPLITS, pairs
from stabexp.config import ConfigError
from stabexp.data import hf
from stabexp.data.corpus import read_lines, read_split
from stabexp.data.translation import load_corpus

# The toy corpus of tests/corpus.py, its splits under the names the hub's datasets use.
HF_SPLITS = {"train": "train", "val": "validation", "test_2016_flickr": "test"}


def _chunks():
    """The corpus's sentence pairs by the dataset's split name, in tests/corpus.py's cut."""
    out, start, all_pairs = {}, 0, pairs()
    for split, n in SPLITS.items():
        out[HF_SPLITS[split]], start = all_pairs[start:start + n], start + n
    return out


def _overrides(dataset, *extra):
    """A small translation run on a Hugging Face dataset (the settings of corpus.translation_overrides)."""
    return ["task=translation", f"task.hf_dataset={dataset}", "task.vocab_size=200", "task.eval_batch_size=8",
            "task.max_len=30", "train.max_tokens=120", "model.dropout=0.0", *extra]


def _tree(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture(autouse=True)
def offline_hub(tmp_path, monkeypatch):
    """Offline before `datasets` is imported, the Hugging Face caches and STABEXP_DATA in tmp_path;
    the library's settings too, for a `datasets` an earlier test imported already."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_home" / "datasets"))
    monkeypatch.setenv("STABEXP_DATA", str(tmp_path / "data"))
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_home" / "datasets")
    datasets.disable_progress_bars()  # the error tests read a clean stderr
    yield
    datasets.enable_progress_bars()


@pytest.fixture
def saved_dataset(tmp_path):
    """The toy corpus as a DatasetDict with a `translation` column of the WMT datasets' type,
    splits train / validation / test, saved with save_to_disk."""
    from datasets import Dataset, DatasetDict, Features, Translation

    features = Features({"translation": Translation(languages=["de", "en"])})
    dd = DatasetDict({split: Dataset.from_dict({"translation": [{"de": de, "en": en} for de, en in chunk]},
                                               features=features)
                      for split, chunk in _chunks().items()})
    dd.save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved"


@pytest.fixture
def jsonl_dataset(tmp_path):
    """The toy corpus as json lines with a column per language: train / dev / test.jsonl."""
    folder = tmp_path / "jsonl"
    folder.mkdir()
    for split, chunk in _chunks().items():
        name = "dev" if split == "validation" else split
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for de, en in chunk:
                f.write(json.dumps({"en": en, "de": de}, ensure_ascii=False) + "\n")
    return folder


# --- whole runs and the files ---------------------------------------------------------------------

def test_a_saved_dataset_trains_and_its_files_are_its_rows(make_cfg, saved_dataset, tmp_path):
    from stabexp.train.trainer import train

    cfg = make_cfg(*_overrides(saved_dataset), "group=preln", "train.steps=2", "train.eval_every=2",
                   "task.bleu_sentences=4")
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["test_bleu"] >= 0
    folder = Path(summary["data"]["corpus"])
    assert folder.is_relative_to(Path(os.environ["STABEXP_DATA"]) / "hf" / "local")
    # The task's split names (train / valid / test) on the dataset's (train / validation / test).
    assert sorted(p.name for p in folder.iterdir()) == [f"{s}.{lang}" for s in ("test", "train", "valid")
                                                        for lang in ("de", "en")]
    assert {role: s["name"] for role, s in summary["data"]["splits"].items()} == {
        "train": "train", "valid": "valid", "test": "test"}
    for name, split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        chunk = _chunks()[split]
        assert read_lines(folder / f"{name}.de") == [de for de, _ in chunk]
        assert read_lines(folder / f"{name}.en") == [en for _, en in chunk]


def test_the_same_sentences_from_a_folder_give_the_same_corpus(make_cfg, saved_dataset, corpus_dir):
    """The dataset and tests/corpus.py's folder (the same pairs, gzipped train, other split
    names): the same lines, the same subword model bytes, the same ids in every split."""
    from_hf = load_corpus(make_cfg(*_overrides(saved_dataset)).task)
    from_folder = load_corpus(make_cfg(*_overrides(saved_dataset), "task.hf_dataset=", f"task.path={corpus_dir}",
                                       "task.valid_split=val", "task.test_split=test_2016_flickr").task)
    assert from_hf.subwords.path != from_folder.subwords.path  # two cache entries ...
    assert from_hf.subwords.path.read_bytes() == from_folder.subwords.path.read_bytes()  # ... of one model
    assert from_hf.subwords.path.name.startswith("saved.de-en.bpe200.")
    for role in ("train", "valid", "test"):
        a, b = from_hf.splits[role], from_folder.splits[role]
        assert (a.text.src, a.text.tgt, a.src, a.tgt) == (b.text.src, b.text.tgt, b.src, b.tgt), role


def test_a_folder_of_json_lines_with_a_column_per_language(make_cfg, jsonl_dataset, corpus_dir):
    """English to German from train / dev / test.jsonl: 'valid' maps onto 'dev'."""
    corpus = load_corpus(make_cfg(*_overrides(jsonl_dataset), "task.src_lang=en", "task.tgt_lang=de").task)
    reference = read_split(corpus_dir, "val", "en", "de")
    assert corpus.splits["valid"].text.src == reference.src and corpus.splits["valid"].text.tgt == reference.tgt
    assert corpus.folder.parent.name.startswith("jsonl-") and (corpus.folder / "valid.en").is_file()


def test_a_second_load_reads_the_files_without_datasets(make_cfg, saved_dataset, monkeypatch):
    cfg = make_cfg(*_overrides(saved_dataset)).task
    first = load_corpus(cfg)
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now fails
    again = load_corpus(cfg)
    assert again.folder == first.folder and again.splits["train"].src == first.splits["train"].src
    # A folder saved anew is a new source (its fingerprint changed): that one needs `datasets`.
    (saved_dataset / "dataset_dict.json").touch()
    os.utime(saved_dataset / "dataset_dict.json", ns=(1, 1))
    with pytest.raises(ConfigError, match=r"make install EXTRAS=hf in a checkout, or pip install"):
        load_corpus(cfg)


def test_a_sentence_with_a_line_break_stays_one_line(make_cfg, tmp_path):
    """A line break inside a sentence would shift every later line against the other side."""
    from datasets import Dataset, DatasetDict

    rows = {"de": ["Ein Hund\nläuft.", "Eine Frau sitzt.", None], "en": ["A dog\r\nruns.", "A woman sits.", "x"]}
    DatasetDict({s: Dataset.from_dict(rows) for s in ("train", "dev", "test")}).save_to_disk(str(tmp_path / "breaks"))
    folder = hf.materialise(make_cfg(*_overrides(tmp_path / "breaks")).task, Path(os.environ["STABEXP_DATA"]))
    assert read_lines(folder / "train.de") == ["Ein Hund läuft.", "Eine Frau sitzt.", ""]
    assert read_lines(folder / "valid.en") == ["A dog runs.", "A woman sits.", "x"]


def test_a_failed_write_leaves_no_file(make_cfg, saved_dataset, monkeypatch):
    """Each file is renamed into place only when whole: a failure while writing leaves neither
    the file nor its temporary beside it, and the next load writes it."""
    real = hf.sentence_pairs

    def failing(split, rows_hold, langs):
        for i, pair in enumerate(real(split, rows_hold, langs)):
            if i == 50:
                raise OSError("disk full")
            yield pair
    monkeypatch.setattr(hf, "sentence_pairs", failing)
    cfg = make_cfg(*_overrides(saved_dataset)).task
    with pytest.raises(OSError, match="disk full"):
        hf.materialise(cfg, Path(os.environ["STABEXP_DATA"]))
    folder = hf.cache_folder(hf.source(cfg), Path(os.environ["STABEXP_DATA"]))
    assert _tree(folder) == []
    monkeypatch.setattr(hf, "sentence_pairs", real)
    assert len(read_lines(hf.materialise(cfg, Path(os.environ["STABEXP_DATA"])) / "train.de")) == 110


# --- split names and the cache folder -------------------------------------------------------------

@pytest.mark.parametrize("wanted, available, chosen", [
    ("valid", ["train", "validation", "test"], "validation"),
    ("valid", ["train", "dev", "test"], "dev"),
    ("valid", ["valid", "validation"], "valid"),          # an exact name wins
    ("validation", ["train", "dev"], "dev"),
    ("test", ["Test"], "Test"),
    ("newstest2014", ["train", "newstest2014"], "newstest2014"),
])
def test_split_names_map_onto_the_dataset_s(wanted, available, chosen):
    assert hf.dataset_split("valid_split", wanted, available, "x") == chosen


def test_the_presets_compose_with_a_pinned_revision(make_cfg):
    from stabexp.config import validate

    for task, config, tgt in (("wmt14_en_de", "de-en", "de"), ("wmt14_en_fr", "fr-en", "fr")):
        wmt = make_cfg(f"task={task}")
        validate(wmt)
        t = wmt.task
        assert (t.hf_dataset, t.hf_config, t.src_lang, t.tgt_lang) == ("wmt/wmt14", config, "en", tgt)
        assert len(t.hf_revision) == 40 and int(t.hf_revision, 16) >= 0
        assert hf.cache_folder(hf.source(t), Path("/d")) == Path(f"/d/hf/wmt/wmt14/{config}/{t.hf_revision}")
    iwslt = make_cfg("task=iwslt14_de_en", "task.path=/somewhere")
    validate(iwslt)
    assert (iwslt.task.src_lang, iwslt.task.tgt_lang, iwslt.task.hf_dataset) == ("de", "en", "")


# --- one-line errors that write nothing -------------------------------------------------------------

def _fails_in_one_line(stabexp_main, args, *words):
    data = Path(os.environ["STABEXP_DATA"])
    before = _tree(data)
    r = stabexp_main("run", *args)
    assert r.returncode == 2
    line = one_line_error(r, *words)
    assert line.startswith("stabexp: error: ")
    assert not stabexp_main.outputs.exists() and _tree(data) == before
    return line


@pytest.mark.parametrize("extra, words", [
    (["task.src_lang=fr"], ["task.src_lang=fr", "hold no 'fr' text", "de, en"]),
    (["task.test_split=holdout"], ["task.test_split=holdout", "no such split", "train, validation, test"]),
    (["task.hf_config=de-en"], ["task.hf_config=de-en", "save_to_disk", "no configurations"]),
    (["task.hf_revision=abc123"], ["task.hf_revision=abc123", "local folder"]),
], ids=["language", "split", "config", "revision"])
def test_bad_values_for_a_saved_dataset_are_one_line(stabexp_main, saved_dataset, extra, words):
    _fails_in_one_line(stabexp_main, _overrides(saved_dataset, *extra), *words)


@pytest.fixture
def two_configs(tmp_path):
    """A folder of data files with two configurations, declared in its README as on the hub."""
    folder = tmp_path / "pairs"
    for config in ("de-en", "fr-en"):
        (folder / config).mkdir(parents=True)
        lang = config.split("-")[0]
        for split in ("train", "validation", "test"):
            (folder / config / f"{split}.jsonl").write_text(json.dumps({lang: "x", "en": "y"}) + "\n")
    declared = "".join(f"- config_name: {c}\n  data_files:\n"
                       + "".join(f"  - split: {s}\n    path: {c}/{s}.jsonl\n" for s in ("train", "validation", "test"))
                       for c in ("de-en", "fr-en"))
    (folder / "README.md").write_text(f"---\nconfigs:\n{declared}---\n")
    return folder


@pytest.mark.parametrize("extra, words", [
    ([], ["task.hf_config=None", "needs a configuration", "it has de-en, fr-en"]),
    (["task.hf_config=it-en"], ["task.hf_config=it-en", "no such configuration", "it has de-en, fr-en"]),
], ids=["missing", "unknown"])
def test_a_missing_or_unknown_config_lists_the_dataset_s(stabexp_main, two_configs, extra, words):
    _fails_in_one_line(stabexp_main, _overrides(two_configs, *extra), *words)


def test_a_config_picks_its_files(make_cfg, two_configs):
    folder = hf.materialise(make_cfg(*_overrides(two_configs, "task.hf_config=fr-en", "task.src_lang=fr")).task,
                            Path(os.environ["STABEXP_DATA"]))
    assert folder.name == "fr-en" and read_lines(folder / "valid.fr") == ["x"]


@pytest.mark.parametrize("args, words", [
    (_overrides("nobody/no-such-dataset"), ["task.hf_dataset=nobody/no-such-dataset", "cannot be loaded",
                                            "Couldn't reach", "OfflineModeIsEnabled"]),
    (["task=wmt14_en_de"], ["task.hf_dataset=wmt/wmt14", "cannot be loaded", "Couldn't reach",
                            "HF_HUB_OFFLINE is set"]),
    (_overrides("not/a/hub/id"), ["task.hf_dataset=not/a/hub/id", "neither a folder nor a dataset id"]),
], ids=["unknown-id", "preset-offline", "not-an-id"])
def test_a_dataset_that_cannot_be_reached_is_one_line(stabexp_main, args, words):
    _fails_in_one_line(stabexp_main, args, *words)


def test_a_hub_out_of_reach_fails_at_once(stabexp_main, monkeypatch):
    """Without a network (and without HF_HUB_OFFLINE) the hub's client retries for half a minute
    before it gives up: the hub is tried once, load_dataset never, and the line says what to set."""
    import socket

    import datasets
    import huggingface_hub.constants

    with socket.socket() as closed:  # a port of this machine that nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)  # a proxy would be tried instead of the port
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("load_dataset was tried"))
    _fails_in_one_line(stabexp_main, ["task=wmt14_en_de"], "task.hf_dataset=wmt/wmt14", "cannot be reached",
                       f"127.0.0.1:{port}", "HF_HUB_OFFLINE=1")


def test_a_dataset_with_a_loading_script_is_one_line(stabexp_main, tmp_path):
    """datasets no longer runs loading scripts (what old hub revisions of WMT and IWSLT hold)."""
    folder = tmp_path / "scripted"
    folder.mkdir()
    (folder / "scripted.py").write_text("raise SystemExit('a loading script must never run')\n")
    _fails_in_one_line(stabexp_main, _overrides(folder), "holds a loading script", "json / csv / parquet")


def test_a_missing_datasets_package_is_one_line(stabexp_main, saved_dataset, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    line = _fails_in_one_line(stabexp_main, _overrides(saved_dataset), f"task.hf_dataset={saved_dataset}",
                              "make install EXTRAS=hf", 'pip install "datasets>=')
    assert "not installed" in line
