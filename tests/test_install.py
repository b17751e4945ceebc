"""A plain (not editable) install, as a user gets it from `pip install git+URL` or a wheel: the
configs ship inside the package, run folders go under ./outputs of the working directory, and a
user's own config folder extends the built-in groups and presets the Hydra way."""

import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with stabexp installed from a copy of the checkout; the dependencies (torch, hydra, ...)
    come from this environment through a .pth path entry (its own .pth files, among them the
    editable install of stabexp, are not read: only the new venv's stabexp is importable)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "checkout"
    source.mkdir()
    for name in ("src", "conf", "pyproject.toml", "README.md"):
        (shutil.copytree if (CHECKOUT / name).is_dir() else shutil.copy)(CHECKOUT / name, source / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    new_site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
    (new_site / "deps_of_the_test_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # What `pip install <checkout>` does: build a wheel (here with this environment's setuptools:
    # no index is needed), then install it.
    wheels = root / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        str(next(wheels.glob("stabexp-*.whl")))], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.rmtree(source)  # nothing may read the checkout from now on
    return venv


def _stabexp(venv, cwd, *args, env_extra=None):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("STABEXP_") or k == "STABEXP_DATA"}
    env.update(env_extra or {})
    return subprocess.run([str(venv / "bin" / "stabexp"), *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def test_the_installed_package_is_not_the_checkout(installed):
    where = subprocess.run([str(installed / "bin" / "python"), "-c", "import stabexp; print(stabexp.__file__)"],
                           check=True, capture_output=True, text=True).stdout
    assert str(installed) in where and str(CHECKOUT) not in where


def test_list_and_a_two_step_run_from_any_folder(installed, tmp_path):
    r = _stabexp(installed, tmp_path, "list")
    assert r.returncode == 0, r.stderr
    assert "deepnorm" in r.stdout and "deepnet_early" in r.stdout
    r = _stabexp(installed, tmp_path, "run", *TINY, "group=postln", "train.steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((tmp_path / "outputs" / "runs").iterdir())  # ./outputs of the working directory
    assert len(runs) == 1
    assert json.loads((runs[0] / "summary.json").read_text())["steps_done"] == 2
    r = _stabexp(installed, tmp_path, "run", *TINY, "group=postln", "train.steps=2",
                 env_extra={"STABEXP_OUTPUTS": str(tmp_path / "elsewhere")})
    assert r.returncode == 0 and list((tmp_path / "elsewhere" / "runs").iterdir())


def test_a_users_own_group_and_preset_from_a_config_dir(installed, tmp_path):
    mine = tmp_path / "my_conf"
    (mine / "group").mkdir(parents=True)
    (mine / "experiment").mkdir()
    (mine / "group" / "postln_half_warmup.yaml").write_text(
        "# @package group\nname: postln_half_warmup\ndescription: Post-LN, warm-up, Post-LN-init\n"
        "citation: a user\nresidual: postln\ninit: postln_init\nschedule: warmup_inverse_sqrt\n")
    (mine / "experiment" / "my_sweep.yaml").write_text(
        "# @package _global_\n# My sweep: my group against Post-LN.\nexperiment: my_sweep\n"
        "hydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n      group: postln_half_warmup,postln\n"
        "train:\n  steps: 2\n")
    r = _stabexp(installed, tmp_path, "list", "--config-dir", str(mine))
    assert "postln_half_warmup" in r.stdout and "My sweep: my group against Post-LN." in r.stdout
    r = _stabexp(installed, tmp_path, "run", "--config-dir", str(mine), "experiment=my_sweep", *TINY[:4])
    assert r.returncode == 0, r.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "outputs").rglob("summary.json")]
    assert sorted(s["group"] for s in summaries) == ["postln", "postln_half_warmup"]
    # The same group through hydra.searchpath; without either, it is an unknown group.
    r = _stabexp(installed, tmp_path, "run", f"hydra.searchpath=[file://{mine}]", "group=postln_half_warmup", *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _stabexp(installed, tmp_path, "run", "group=postln_half_warmup", *TINY)
    assert r.returncode == 2 and "group=postln_half_warmup is not a known group" in r.stderr
