"""A small German-English parallel corpus written by the tests, in Multi30k's layout
(train / val / test_2016_flickr, .de / .en; train gzipped, the others plain), made of templates
so that a tiny model can learn something from it in a few dozen steps."""

import gzip
import itertools
import random
from pathlib import Path

SUBJECTS = [("Ein Mann", "A man"), ("Eine Frau", "A woman"), ("Ein Hund", "A dog"),
            ("Ein kleines Mädchen", "A little girl"), ("Zwei Jungen", "Two boys"),
            ("Ein älterer Herr", "An older gentleman")]
VERBS = [("läuft", "runs"), ("sitzt", "sits"), ("spielt", "plays"), ("wartet", "waits"),
         ("schläft", "sleeps")]
PLACES = [("im Park", "in the park"), ("auf der Straße", "on the street"), ("am Strand", "on the beach"),
          ("vor dem Haus", "in front of the house"), ("im Schnee", "in the snow")]
SPLITS = {"train": 110, "val": 20, "test_2016_flickr": 20}


def pairs():
    out = [(f"{s} {v} {p}.", f"{se} {ve} {pe}.")
           for (s, se), (v, ve), (p, pe) in itertools.product(SUBJECTS, VERBS, PLACES)]
    random.Random(0).shuffle(out)
    return out


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    all_pairs, start = pairs(), 0
    for split, n in SPLITS.items():
        chunk, start = all_pairs[start:start + n], start + n
        for side, lang in ((0, "de"), (1, "en")):
            text = "".join(p[side] + "\n" for p in chunk).encode("utf-8")
            if split == "train":
                (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(text, mtime=0))
            else:
                (folder / f"{split}.{lang}").write_bytes(text)
    return folder


# What a translation run on this corpus needs on top of the tiny test settings (conftest.TINY).
def translation_overrides(folder: Path):
    return ["task=translation", f"task.path={folder}", "task.train_split=train", "task.valid_split=val",
            "task.test_split=test_2016_flickr", "task.vocab_size=200", "task.eval_batch_size=8",
            "task.max_len=30", "train.max_tokens=120", "model.dropout=0.0"]
