"""Hydra's launcher plugins (the `launchers` extra): a sweep through submitit_local (each job in
a process of its own, as on SLURM) writes the files of the basic launcher's sweep, and a job
killed mid-run is resumed by the next launch of the sweep."""

import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import TINY, assert_same_files, cli_command, cli_env

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the launchers extra (make install "
                    "EXTRAS=test,launchers; make test installs it)")

SWEEP = [*TINY, "group=postln,preln", "train.steps=40", "probe.first_steps=0", "probe.every=1",
         "train.checkpoint_every=4", "model.dropout=0.1"]


def _sweep(outputs, *extra, wait=True):
    env, cmd = cli_env(outputs), cli_command("run", "-m", *SWEEP, *extra)
    if wait:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return r
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _jobs(outputs):
    sweep = next((outputs / "multirun").iterdir())
    return sweep, {p.name: p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    outputs = tmp_path_factory.mktemp("basic")
    _sweep(outputs, "hydra/launcher=basic")
    return _jobs(outputs)[1]


def test_a_submitit_local_sweep_writes_the_basic_launchers_files(tmp_path, basic):
    _sweep(tmp_path, "hydra/launcher=submitit_local")
    sweep, jobs = _jobs(tmp_path)
    assert sorted(jobs) == sorted(basic) and len(jobs) == 2
    assert (sweep / ".submitit").is_dir()  # the jobs did go through submitit
    for name in jobs:
        assert json.loads((jobs[name] / "summary.json").read_text())["status"] == "completed"
        assert_same_files(jobs[name], basic[name], name)


def test_a_killed_sweep_resumes_its_job_through_submitit(tmp_path, basic):
    """The basic launcher runs the jobs in its own process: SIGKILL mid-way through the second
    job, then launch the sweep again with submitit_local."""
    proc = _sweep(tmp_path, "hydra/launcher=basic", wait=False)
    deadline = time.time() + 120
    target = None
    while time.time() < deadline and proc.poll() is None:
        # the sweep folder appears a moment after multirun/: poll until both exist
        if any((tmp_path / "multirun").glob("*/")):
            _, jobs = _jobs(tmp_path)
            started = [p for p in jobs.values() if (p / "metrics.csv").exists()]
            if len(started) == 2:
                target = next(p for p in started if not (p / "summary.json").exists()
                              or json.loads((p / "summary.json").read_text()).get("status") == "running")
                if sum(1 for _ in open(target / "metrics.csv")) > 12:
                    break
        time.sleep(0.005)
    assert proc.poll() is None, "the sweep ended before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    _sweep(tmp_path, "hydra/launcher=submitit_local")
    sweep, jobs = _jobs(tmp_path)
    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.*"))
    assert "already completed" in logs and "resuming" in logs, logs[-3000:]
    summary = json.loads((target / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"], summary
    for name in jobs:
        assert_same_files(jobs[name], basic[name], name)
    status = subprocess.run([sys.executable, "-m", "stabexp.cli", "status", str(sweep)], capture_output=True,
                            text=True, check=True).stdout
    assert "2 runs: 2 completed" in status
