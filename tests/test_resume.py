"""Exact resume: a run killed (SIGKILL) or stopped (SIGTERM, SIGUSR1, SIGINT) at any step and
run again ends with the files of a run that never stopped (wall-clock columns aside); the lock
of a run folder; the checkpoint's atomic write."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import stabexp.train.trainer as trainer
from conftest import TINY, assert_same_files, cli_command, cli_env, fail_at_step
from stabexp.train import checkpoint
from stabexp.train.files import RunLock, RunLocked, is_locked

# Dropout on (the global generator), probes and weight probes at every step, an eval every 4:
# every random stream and every file a run writes takes part.
RUN = [*TINY, "group=preln", "model.dropout=0.1", "train.steps=60", "probe.first_steps=0", "probe.every=1",
       "probe.weights=true", "train.eval_every=4", "train.checkpoint_every=5", "probe.at_init=true"]


@pytest.fixture
def kill_row():
    """The metrics row at which a test stops its run: drawn from a seed that each failure
    names, so STABEXP_KILL_SEED=<seed> replays it."""
    seed = int(os.environ.get("STABEXP_KILL_SEED") or random.randrange(10 ** 6))
    row = random.Random(seed).randint(8, 50)
    return row, f"(stopped at metrics row {row}; replay with STABEXP_KILL_SEED={seed})"


def _run_dir(outputs):
    return next((outputs / "runs").iterdir())


def _rows(path):
    return sum(1 for _ in open(path)) - 1 if path.exists() else 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    outputs = tmp_path_factory.mktemp("uninterrupted")
    cmd, env = cli_command("run", *RUN), cli_env(outputs)
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
    return _run_dir(outputs)


def _start_and_stop(outputs, sig, at_rows):
    """Start the run in a subprocess, send `sig` once metrics.csv has `at_rows` rows."""
    cmd, env = cli_command("run", *RUN), cli_env(outputs)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        runs = outputs / "runs"
        if runs.exists() and any(runs.iterdir()) and _rows(_run_dir(outputs) / "metrics.csv") >= at_rows:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"the run ended before the signal: {proc.communicate()[1][-2000:]}"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_a_run_killed_at_a_random_step_resumes_to_the_same_files(tmp_path, uninterrupted, kill_row):
    at_rows, replay = kill_row
    code, _ = _start_and_stop(tmp_path, signal.SIGKILL, at_rows)
    assert code == -signal.SIGKILL, replay
    run = _run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "running"  # what a killed run leaves; its lock died with it
    assert not is_locked(run)
    killed_at = _rows(run / "metrics.csv")
    cmd, env = cli_command("run", *RUN), cli_env(tmp_path)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (replay, r.stderr[-2000:])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == 60, replay
    assert len(summary["resumed_from"]) == 1 and summary["resumed_from"][0] % 5 == 0, (replay, killed_at, summary)
    assert not (run / checkpoint.CHECKPOINT).exists() and not (run / "run.lock").exists(), replay
    assert_same_files(run, uninterrupted, replay)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_a_stop_request_checkpoints_at_the_end_of_the_step_and_resumes(tmp_path, uninterrupted, sig, kill_row):
    at_rows, replay = kill_row
    code, err = _start_and_stop(tmp_path, sig, at_rows)
    run = _run_dir(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert code != 0 and summary["status"] == "interrupted", (replay, err[-2000:])
    # 128 + the signal, as the shell gives a process a signal stopped, and no traceback.
    assert code == 128 + sig and "Traceback" not in err, (replay, err[-2000:])
    assert summary["interrupted_by"] == signal.Signals(sig).name, replay
    state = checkpoint.load(run, _resolved(run))
    assert state["step"] == summary["checkpoint_step"], replay
    assert _rows(run / "metrics.csv") == state["csv"]["metrics"][0], replay  # nothing written after it
    cmd, env = cli_command("run", *RUN), cli_env(tmp_path)
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
    assert json.loads((run / "summary.json").read_text())["resumed_from"] == [state["step"]], replay
    assert_same_files(run, uninterrupted, replay)


def _resolved(run):
    from omegaconf import OmegaConf

    return OmegaConf.load(run / "config.yaml")


def test_a_finished_run_is_skipped_and_overwrite_starts_over(make_cfg, tmp_path):
    cfg = make_cfg("group=postln", "train.checkpoint_every=2")
    first = trainer.train(cfg, tmp_path)
    assert not (tmp_path / checkpoint.CHECKPOINT).exists()
    assert trainer.train(cfg, tmp_path) == first
    cfg.overwrite = True
    again = trainer.train(cfg, tmp_path)
    assert again["status"] == "completed" and "resumed_from" not in again


def test_a_checkpoint_of_another_config_is_a_clear_error(make_cfg, tmp_path, monkeypatch):
    from stabexp.config import ConfigError

    cfg = make_cfg("group=postln", "train.checkpoint_every=2")
    real = trainer.Run.step
    monkeypatch.setattr(trainer.Run, "step", lambda self, step: real(self, step) if step < 5 else 1 / 0)
    with pytest.raises(ZeroDivisionError):
        trainer.train(cfg, tmp_path)
    assert (tmp_path / checkpoint.CHECKPOINT).exists()
    with pytest.raises(ConfigError, match="another config"):
        trainer.train(make_cfg("group=postln", "train.checkpoint_every=2", "train.lr=0.002"), tmp_path)


def test_a_failed_run_resumes_from_its_last_checkpoint(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg("group=postln", "train.checkpoint_every=2", "train.steps=8")
    reference = trainer.train(cfg, tmp_path / "reference")
    fail_at_step(monkeypatch, cfg, tmp_path / "run", 5)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"
    summary = trainer.train(cfg, tmp_path / "run")
    assert summary["resumed_from"] == [4] and summary["final_eval_loss"] == reference["final_eval_loss"]
    assert_same_files(tmp_path / "run", tmp_path / "reference")


def test_a_run_resumed_in_a_process_of_other_threads_goes_on_at_its_own(make_cfg, tmp_path, monkeypatch):
    """Stopped at 1 thread and resumed where the launcher gives 2 (a sweep of another size): the
    run goes on at the 1 it started with, and its files are the uninterrupted run's."""
    import torch

    cfg = make_cfg("group=postln", "train.checkpoint_every=2", "train.steps=12", "model.d_model=32")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        trainer.train(cfg, tmp_path / "reference")
        fail_at_step(monkeypatch, cfg, tmp_path / "run", 5)
        torch.set_num_threads(2)
        seen, real = set(), trainer.Run.step
        monkeypatch.setattr(trainer.Run, "step", lambda self, i: seen.add(torch.get_num_threads()) or real(self, i))
        summary = trainer.train(cfg, tmp_path / "run")
        assert seen == {1} and summary["threads"] == 1
        assert torch.get_num_threads() == 2  # the process's own, given back when the run ends
    finally:
        torch.set_num_threads(threads)
    assert summary["resumed_from"] == [4]
    assert_same_files(tmp_path / "run", tmp_path / "reference")


def test_one_process_per_run_folder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    held = RunLock(tmp_path).acquire()
    with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
        RunLock(tmp_path).acquire()
    assert is_locked(tmp_path)
    held.release()
    assert not is_locked(tmp_path)
    # A process that dies holding the lock leaves the file, not the lock.
    code = (f"from stabexp.train.files import RunLock; import os; RunLock({str(tmp_path)!r}).acquire(); "
            "os._exit(9)")
    subprocess.run([sys.executable, "-c", code], check=False, timeout=60)
    assert (tmp_path / "run.lock").exists() and not is_locked(tmp_path)
    taken = RunLock(tmp_path).acquire()
    assert taken.previous_holder.startswith("pid ")
    taken.release()


def test_a_second_process_on_a_running_folder_stops_with_one_line(stabexp_cli):
    args = [*TINY, "group=postln"]
    stabexp_cli("run", *args)
    run = next((stabexp_cli.outputs / "runs").iterdir())
    (run / "summary.json").write_text(json.dumps({"status": "running"}))
    held = RunLock(run).acquire()
    try:
        r = stabexp_cli("run", *args)
    finally:
        held.release()
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith(f"stabexp: error: {run} is being run by pid {os.getpid()}")


def test_the_checkpoint_is_replaced_atomically(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, {"step": 1})
    import torch

    def broken(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, {"step": 2})
    monkeypatch.undo()
    assert torch.load(tmp_path / checkpoint.CHECKPOINT, weights_only=False)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.CHECKPOINT]  # the half-written temp file is gone


def test_a_full_disk_at_a_checkpoint_keeps_the_last_one_and_the_run_resumes(make_cfg, tmp_path, monkeypatch):
    import errno

    import torch

    cfg = make_cfg("group=postln", "train.checkpoint_every=2", "train.steps=8")
    reference = trainer.train(cfg, tmp_path / "reference")
    real, calls = torch.save, []

    def full_disk_on_the_second(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the checkpoint of step 4
            f.write(b"the first bytes")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch, "save", full_disk_on_the_second)
        with pytest.raises(OSError, match="No space left"):
            trainer.train(cfg, tmp_path / "run")
    run = tmp_path / "run"
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    assert torch.load(run / checkpoint.CHECKPOINT, weights_only=False)["step"] == 2
    assert not list(run.glob(".*.part"))
    summary = trainer.train(cfg, run)
    assert summary["resumed_from"] == [2] and summary["final_eval_loss"] == reference["final_eval_loss"]
    assert_same_files(run, tmp_path / "reference")


def test_a_schedulers_own_handler_runs_after_the_checkpoint(make_cfg, tmp_path, monkeypatch):
    """submitit requeues a SLURM job from its handler of SIGUSR2 and exits: that handler must
    find the checkpoint of the step the signal arrived in already written."""
    calls = []

    def submitit_like(signum, frame):
        calls.append((signum, (tmp_path / checkpoint.CHECKPOINT).exists()))
        raise SystemExit(-1)

    previous = signal.signal(signal.SIGUSR2, submitit_like)
    real = trainer.Run.step

    def step(self, n):
        ok = real(self, n)
        if n == 3:
            os.kill(os.getpid(), signal.SIGUSR2)
        return ok

    monkeypatch.setattr(trainer.Run, "step", step)
    try:
        with pytest.raises(SystemExit):
            trainer.train(make_cfg("group=postln", "train.checkpoint_every=0"), tmp_path)
        assert signal.getsignal(signal.SIGUSR2) is submitit_like  # ours is gone again
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert calls == [(signal.SIGUSR2, True)]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpoint_step"] == 3
    assert summary["interrupted_by"] == "SIGUSR2" and not (tmp_path / "run.lock").exists()


def test_a_translation_run_resumes_mid_epoch_to_the_same_files(make_cfg, corpus_dir, tmp_path, monkeypatch):
    """Padded batches from a length-bucketed epoch, two per step (train.update_freq), label
    smoothing and dropout: the checkpoint keeps the epoch's remaining batches and the stream's
    generator."""
    from corpus import translation_overrides

    cfg = make_cfg(*translation_overrides(corpus_dir), "group=postln_warmup", "train.steps=10",
                   "train.eval_every=5", "train.checkpoint_every=3", "train.max_tokens=60", "train.update_freq=2", "model.dropout=0.1")
    reference = trainer.train(cfg, tmp_path / "reference")
    fail_at_step(monkeypatch, cfg, tmp_path / "run", 8)
    summary = trainer.train(cfg, tmp_path / "run")
    assert summary["resumed_from"] == [6] and summary["target_tokens"] == reference["target_tokens"]
    assert summary["test_bleu"] == reference["test_bleu"]
    assert_same_files(tmp_path / "run", tmp_path / "reference")
