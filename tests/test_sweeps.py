"""Packed sweeps (stabexp.sweep, Hydra launcher `packed`, the default): how jobs share a machine,
and end to end through the CLI: every run's files byte for byte those of the same run launched
alone at the same threads, a killed job reported and the others finished, a stop request
checkpointing every running job and the same command resuming the sweep."""

import json
import os
import runpy
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import TINY, cli_command, cli_env, one_line_error, run_cli
from stabexp import memory, sweep
from stabexp.compose import compose as compose_config

GiB = 2 ** 30


def _job(memory_bytes=GiB, threads=0, on_gpu=False):
    return sweep.Job(0, [], None, Path("."), memory_bytes, 1.0, threads, on_gpu)


@pytest.mark.parametrize("jobs, cores, ram, expected", [
    ([_job()] * 36, 2, 24 * GiB, (2, 1)),            # deepnet_depth on this machine: 2 at once, 1 thread each
    ([_job()] * 36, 16, 128 * GiB, (16, 1)),
    ([_job()], 16, 128 * GiB, (1, 16)),              # one job has every core
    ([_job()] * 3, 16, 128 * GiB, (3, 5)),
    ([_job(5 * GiB)] * 3, 2, 8 * GiB, (1, 2)),       # 1,000-layer runs on a small machine: one at a time
    ([_job(5 * GiB)] * 3, 16, 24 * GiB, (3, 5)),
    ([_job(threads=2)] * 36, 2, 24 * GiB, (1, 2)),   # train.threads=2 on 2 cores
])
def test_packing_shares_cores_and_memory_out(jobs, cores, ram, expected):
    pack = sweep.packing(jobs, cores, ram)
    assert (pack.at_once, pack.threads) == expected
    assert pack.at_once * pack.threads <= max(cores, pack.threads)


def test_packing_on_gpus_counts_each_devices_memory():
    jobs = [_job(9 * GiB, on_gpu=True)] * 20
    pack = sweep.packing(jobs, 16, 128 * GiB, gpu_memory=[24 * GiB, 80 * GiB])
    # 85% of each GPU's memory over each job's estimate plus a process's own GiB
    assert pack.devices.count(0) == 2 and pack.devices.count(1) == 6
    assert pack.at_once == 8 and pack.threads == 2
    assert sweep.packing(jobs, 16, 128 * GiB, [80 * GiB], at_most=3).at_once == 3


def test_packing_on_a_gpu_runs_no_more_jobs_than_cores():
    """Admin's grid on one H200: 135 small jobs fit its memory many times over, but each process
    feeding the GPU needs a core."""
    jobs = [_job(GiB // 4, on_gpu=True)] * 135
    pack = sweep.packing(jobs, 16, 128 * GiB, gpu_memory=[139 * GiB])
    assert (pack.at_once, pack.threads) == (16, 1)
    assert sweep.packing(jobs, 16, 128 * GiB, [139 * GiB], threads=4).at_once == 4


@pytest.mark.parametrize("overrides, measured_mib", [
    # Peaks recorded in docs/data/deepnet_cells.csv (2026-12-01/02).
    (["experiment=lm_1000_layers", "group=deepnorm", "depth=1000"], 5439.4),
    (["experiment=deepnet_1000_layers", "group=deepnorm", "depth=500"], 4541.8),
    (["experiment=lm_depth", "group=admin", "depth=100"], 876.7),
    (["experiment=lm_depth", "group=admin", "depth=6"], 450.2),
    # A translation batch under a token budget (2026-12-05, its summary.json's peak_memory_mib).
    (["experiment=deepnet_early_paper", "group=postln_warmup", "seed=0"], 13215.3),
])
def test_the_memory_estimate_is_on_the_high_side_of_measured_peaks(overrides, measured_mib):
    estimate = memory.run_bytes(compose_config(overrides)) / 2 ** 20
    assert measured_mib <= estimate <= 3 * measured_mib, estimate


def test_the_default_launcher_is_packed_and_basic_is_one_line_away():
    packed = compose_config(["experiment=deepnet_depth"], return_hydra_config=True)
    basic = compose_config(["hydra/launcher=basic"], return_hydra_config=True)
    assert packed.hydra.launcher._target_.endswith("PackedLauncher")
    assert basic.hydra.launcher._target_.endswith("BasicLauncher")


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_launcher_key_is_one_line(stabexp_main, value):
    one_line_error(stabexp_main("run", "-m", "group=postln,preln", f"hydra.launcher.jobs={value}"),
                   f"hydra.launcher.jobs={value}", ">= 1")


# --- end to end ---------------------------------------------------------------------------

# Long enough (a few seconds a run) for a signal to find two jobs running.
SWEEP = [*TINY, "train.steps=300", "train.checkpoint_every=50", "model.dropout=0.1", "probe.every=1"]
GROUPS = ["postln", "preln", "deepnorm"]


COMPARE = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"))


def assert_same_run(a: Path, b: Path) -> None:
    """Every file of two run folders the same byte for byte, less what the wall clock writes
    (scripts/compare_runs.py: the log, the CSVs' and the summary's wall-clock columns)."""
    names = {p.name for folder in (a, b) for p in folder.iterdir() if p.is_file() and p.name not in COMPARE["SKIP"]}
    assert {"metrics.csv", "layers.csv", "summary.json", "config.yaml"} <= names, names
    for name in sorted(names):
        assert (a / name).exists() and (b / name).exists(), (a, name)
        assert COMPARE["same"](a / name, b / name), (a, name)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """Each job of the sweep launched alone, at one thread: {group: run folder}."""
    outputs = tmp_path_factory.mktemp("alone")
    runs = {}
    for group in GROUPS:
        folder = outputs / group
        env = dict(cli_env(outputs), OMP_NUM_THREADS="1")
        r = subprocess.run(cli_command("run", f"group={group}", *SWEEP, f"hydra.run.dir={folder}"), env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[group] = folder
    return runs


def _sweep_jobs(outputs: Path) -> dict:
    sweep_dir = next((outputs / "multirun").iterdir())
    return {json.loads((p / "summary.json").read_text())["group"]: p
            for p in sweep_dir.iterdir() if (p / "summary.json").exists()}


@pytest.mark.slow
def test_a_packed_sweep_writes_the_files_of_each_run_launched_alone(tmp_path, alone):
    r = run_cli(tmp_path, "run", "-m", f"group={','.join(GROUPS)}", *SWEEP)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 job(s) at a time, 1 thread(s) each" in r.stdout or sweep.cpus() != 2, r.stdout[-3000:]
    assert "# sweep: 3 done, 0 running, 0 waiting" in r.stderr, r.stderr[-3000:]
    jobs = _sweep_jobs(tmp_path)
    assert sorted(jobs) == sorted(GROUPS)
    for group, folder in jobs.items():
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["threads"] == 1
        assert_same_run(folder, alone[group])


def _wait_for(condition, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError("timed out")


def _locked_pids(outputs: Path) -> dict:
    """{run folder: pid} of the jobs holding their lock now."""
    if not (outputs / "multirun").exists():
        return {}
    held = {}
    for lock in (outputs / "multirun").glob("*/*/run.lock"):
        try:
            text = lock.read_text().split()
        except FileNotFoundError:
            continue
        if text[:1] == ["pid"] and (lock.parent / "metrics.csv").exists():
            held[lock.parent] = int(text[1])
    return held


@pytest.mark.slow
def test_a_killed_job_is_reported_and_the_others_finish(tmp_path):
    sweep_args = ["run", "-m", f"group={','.join(GROUPS)}", *SWEEP]
    proc = subprocess.Popen(cli_command(*sweep_args), env=cli_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    victim, pid = next(iter(_wait_for(lambda: _locked_pids(tmp_path)).items()))
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    assert f"{victim}: failed: its process was killed by SIGKILL (out of memory?)" in err, err[-3000:]
    statuses = {p.name: json.loads((p / "summary.json").read_text())["status"] for p in victim.parent.iterdir()
                if (p / "summary.json").exists()}
    assert sorted(statuses.values()) == ["completed", "completed", "failed"], statuses
    status = subprocess.run(cli_command("status", str(victim.parent)), capture_output=True, text=True,
                            env=cli_env(tmp_path))
    line = next(l for l in status.stdout.splitlines() if victim.name in l)
    assert "| failed |" in line and "killed by SIGKILL" in line, status.stdout


@pytest.mark.slow
def test_a_job_whose_forkserver_is_killed_is_interrupted_at_a_checkpoint_not_failed(tmp_path):
    """kill -9 of the process server the jobs are forked from: the job it leaves running is
    stopped at a checkpoint and reported interrupted; the other jobs run; the same command
    resumes it."""
    sweep_args = ["run", "-m", f"group={','.join(GROUPS)}", *SWEEP]
    proc = subprocess.Popen(cli_command(*sweep_args), env=cli_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    victim, pid = next(iter(_wait_for(
        lambda: {f: p for f, p in _locked_pids(tmp_path).items() if sum(1 for _ in open(f / "metrics.csv")) > 8}
    ).items()))
    forkserver = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the job's parent
    os.kill(forkserver, signal.SIGKILL)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1 and "exit code 255" not in err, err[-3000:]
    assert f"{victim}: interrupted: the sweep's process server was killed" in err, err[-3000:]
    summary = json.loads((victim / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (victim / "checkpoint.pt").exists()
    again = run_cli(tmp_path, *sweep_args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((victim / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
@pytest.mark.parametrize("signum, jobs_get", [(signal.SIGINT, "SIGINT"), (signal.SIGKILL, "SIGTERM")])
def test_a_stopped_sweep_checkpoints_every_running_job_and_the_same_command_resumes(tmp_path, alone, signum,
                                                                                    jobs_get):
    """Ctrl-C: the sweep passes it on; kill -9 of the sweep: each job gets SIGTERM from its lifeline."""
    sweep_args = ["run", "-m", f"group={','.join(GROUPS)}", *SWEEP]
    proc = subprocess.Popen(cli_command(*sweep_args), env=cli_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def two_jobs_under_way():
        held = _locked_pids(tmp_path)
        return held if sweep.cpus() < 2 or (len(held) == 2 and all(
            sum(1 for _ in open(f / "metrics.csv")) > 8 for f in held)) else None

    running = _wait_for(two_jobs_under_way)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    if signum == signal.SIGINT:
        assert proc.returncode == 128 + signum, err[-3000:]
        assert "the same command resumes the sweep" in err
    _wait_for(lambda: not _locked_pids(tmp_path))  # no job left running
    if signum == signal.SIGKILL:  # the jobs found nobody to tell they stopped: no traceback for that
        assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
    for folder in running:
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["interrupted_by"] == jobs_get, summary
        assert (folder / "checkpoint.pt").exists()
    again = run_cli(tmp_path, *sweep_args)
    assert again.returncode == 0, again.stderr[-3000:]
    for group, folder in _sweep_jobs(tmp_path).items():
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "completed", summary
        assert_same_run(folder, alone[group])


def test_a_relaunched_sweep_starts_no_process_for_its_finished_jobs(stabexp_main):
    args = ["run", "-m", "group=postln,preln", *TINY]
    assert stabexp_main(*args).returncode == 0
    again = stabexp_main(*args)
    assert again.returncode == 0
    assert "2 job(s) in" in again.stdout + again.stderr and "2 finished before" in again.stdout + again.stderr
    assert "# sweep:" not in again.stderr  # nothing was launched


def test_a_resumed_job_costs_only_the_steps_past_its_checkpoint(tmp_path):
    """The time left of a resumed sweep: a job stopped at step 156 of 200 has 44 steps to go."""
    stopped, fresh = tmp_path / "stopped", tmp_path / "fresh"
    stopped.mkdir()
    (stopped / "summary.json").write_text(json.dumps({"status": "interrupted", "checkpoint_step": 156}))
    assert sweep.steps_left(stopped, 200) == 200  # no checkpoint file: it starts again
    (stopped / "checkpoint.pt").write_bytes(b"")
    assert sweep.steps_left(stopped, 200) == 44
    assert sweep.steps_left(stopped, 200, overwrite=True) == 200  # overwrite=true starts it again
    assert sweep.steps_left(fresh, 200) == 200
    for summary in ({"status": "running"}, {"status": "interrupted", "checkpoint_step": "156"}):  # none, or not a step
        (stopped / "summary.json").write_text(json.dumps(summary))
        assert sweep.steps_left(stopped, 200) == 200


@pytest.mark.parametrize("sweep", [
    ["seed=0,1,2", "depth=2,6", "train.lr=1e-3,5e-4", "optim.betas=[0.9,0.98],[0.9,0.999]"],
    ["experiment=deepnet_depth", "scale=quick"],
    ["group=postln,preln", "train.warmup_steps=0,10", "task=lm"],
])
def test_a_swept_value_set_on_the_first_cell_is_the_cell_hydra_composes(monkeypatch, sweep):
    """stabexp.compose sets a plain key's other values on the first cell's config instead of
    composing each (a sweep of 1,000 seeds: one composition): the same configs either way."""
    from omegaconf import OmegaConf

    from stabexp import compose

    fast = compose.sweep_cells(sweep, True).configs
    monkeypatch.setattr(compose, "_with_value", lambda *args: None)
    composed = compose.sweep_cells(sweep, True).configs
    assert len(fast) == len(composed) > 1
    for a, b in zip(fast, composed):
        assert OmegaConf.to_yaml(a, resolve=True) == OmegaConf.to_yaml(b, resolve=True)
