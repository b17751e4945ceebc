import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import stabexp.config  # noqa: F401  (registers the schema conf/config.yaml composes with)
from stabexp.paths import conf_dir
from stabexp.train.files import WALL_CLOCK as WALL

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


def cli_command(*args):
    """The command line of `stabexp ARGS`: the installed console script (or the module)."""
    exe = Path(sys.executable).with_name("stabexp")
    return [*([str(exe)] if exe.exists() else [sys.executable, "-m", "stabexp.cli"]), *args]


def cli_env(outputs) -> dict:
    return dict(os.environ, STABEXP_OUTPUTS=str(outputs), PYTHONUNBUFFERED="1")


def run_cli(outputs, *args, cwd=None, timeout=600):
    """`stabexp ARGS` in a subprocess, run folders under `outputs`; the finished process."""
    return subprocess.run(cli_command(*args), capture_output=True, text=True, env=cli_env(outputs),
                          cwd=cwd, timeout=timeout)



def fail_at_step(monkeypatch, cfg, out_dir: Path, step: int) -> None:
    """Run train(cfg, out_dir) with optimiser step `step` raising, as a crash mid-run would:
    the folder keeps its last checkpoint and a `failed` summary."""
    import stabexp.train.trainer as trainer

    real = trainer.Run.step
    with monkeypatch.context() as m:
        m.setattr(trainer.Run, "step", lambda self, i: real(self, i) if i != step else 1 / 0)
        with pytest.raises(ZeroDivisionError):
            trainer.train(cfg, out_dir)


def assert_same_files(a: Path, b: Path, note: str = "", config: bool = True) -> None:
    """Two run folders hold the same run: metrics.csv and layers.csv equal bit for bit, and the
    same summary and (unless config=False: runs of configs that differ in how, not what, they
    compute) config, wall-clock time aside. `note` goes into every failure message."""
    import json

    import pandas as pd

    for name in ("metrics.csv", "layers.csv"):
        x, y = pd.read_csv(a / name), pd.read_csv(b / name)
        x, y = x.drop(columns=[c for c in WALL if c in x]), y.drop(columns=[c for c in WALL if c in y])
        pd.testing.assert_frame_equal(x, y, check_exact=True, obj=f"{name} {note}")
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for key in (set(sa) | set(sb)) - set(WALL) - (set() if config else {"config_fingerprint"}):
        assert sa.get(key) == sb.get(key), (key, note)
    assert not config or (a / "config.yaml").read_text() == (b / "config.yaml").read_text(), note


def one_line_error(result, *words) -> str:
    """The result of a command that must fail with one line on stderr holding every word."""
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def stabexp_main(tmp_path, monkeypatch, capsys):
    """`stabexp ARGS` through stabexp.cli.main in this process (outputs under tmp_path): what
    the console script runs, without the cost of a new interpreter."""
    from types import SimpleNamespace

    from stabexp.cli import main

    monkeypatch.setenv("STABEXP_OUTPUTS", str(tmp_path / "outputs"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # `stabexp run` hands its arguments to Hydra there

    def _run(*args):
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exit:  # as the console script ends when the run itself stops
            code = exit.code
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)
    _run.outputs = tmp_path / "outputs"
    return _run


@pytest.fixture
def stabexp_cli(tmp_path):
    """Run the installed console script in a subprocess, outputs under tmp_path."""
    def _run(*args, cwd=None):
        return run_cli(tmp_path / "outputs", *args, cwd=cwd or tmp_path, timeout=300)
    _run.outputs = tmp_path / "outputs"
    return _run


# `make test-fast` (pytest -m "not slow") leaves out the end-to-end tests: the whole-CLI runs in
# subprocesses (the stabexp_cli fixture, test_cli.py), the quick pass over every preset, the wheel
# install, the launchers, the resume tests that signal a subprocess, and the tests marked slow
# by hand (torch.compile, runs of hundreds of steps). `make test` runs everything.
SLOW_FIXTURES = {"stabexp_cli", "quick_outputs", "uninterrupted"}
SLOW_MODULES = {"test_cli", "test_install", "test_launchers"}


# `make test` hands whole files to two workers (pytest-xdist --dist loadfile) in collection order
# (--no-loadscope-reorder): the longest files first, so that the two workers end
# together rather than one starting the presets' quick pass when the other is nearly done.
# Measured with `pytest --durations=0` (2026-12-05, this project's 2-core machine): each of these
# takes 35 s to 5 min of the suite's 18 min of CPU; every other file less.
LONGEST_FIRST = ("test_presets", "test_distributed", "test_sweeps", "test_paper_scale", "test_cli",
                 "test_reference_numbers", "test_resume", "test_docs", "test_plan", "test_install", "test_translation")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or item.module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(rank)))  # stable: each file's own order kept
