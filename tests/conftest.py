import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from stabexp.config import conf_dir

# Tiny and fast: every test model is 2 layers of d=16 unless it says otherwise.
TINY = ["model.d_model=16", "model.ffn_dim=32", "model.n_heads=2", "depth=2",
        "train.steps=6", "train.batch_size=8", "task.eval_batch_size=16",
        "task.probe_batch_size=4", "task.seq_len=6", "probe.first_steps=2", "probe.every=3",
        "train.eval_every=3", "train.warmup_steps=3"]


@pytest.fixture(autouse=True, scope="session")
def _private_data_cache(tmp_path_factory):
    """Every test (and every process it starts) reads and writes data under a temporary
    STABEXP_DATA, never the user's cache."""
    os.environ["STABEXP_DATA"] = str(tmp_path_factory.mktemp("data_cache"))
    yield


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """The small parallel corpus of tests/corpus.py, written once per session."""
    from corpus import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus") / "toy")


@pytest.fixture
def make_cfg():
    """Compose the real config (conf/) with overrides, as Hydra would for `stabexp run`."""
    def _make(*overrides):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            return compose(config_name="config", overrides=[*TINY, *overrides])
    yield _make
    GlobalHydra.instance().clear()


@pytest.fixture
def stabexp_cli(tmp_path):
    """Run the installed console script in a subprocess, outputs under tmp_path."""
    env = dict(os.environ, STABEXP_OUTPUTS=str(tmp_path / "outputs"), PYTHONUNBUFFERED="1")

    def _run(*args, cwd=None):
        exe = Path(sys.executable).with_name("stabexp")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "stabexp.cli"]
        return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env,
                              cwd=cwd or tmp_path, timeout=300)
    _run.outputs = tmp_path / "outputs"
    return _run
