"""The divergence rule at its edges, and which earlier states of a run folder are skipped or run
again (train() on composed configs; the failed run through the CLI, for its exit code)."""

import json
import math

import pandas as pd
import pytest
import torch

import stabexp.train.build
import stabexp.train.trainer as trainer
from conftest import TINY
from stabexp.data import SortTask, SymbolTask
from stabexp.train.run import Run


class ScriptedLosses(SortTask):
    """The sorting task (the default), with the training loss of each step given in advance (plus zero times
    the logits, so that backward and the optimiser run as usual)."""

    def __init__(self, losses, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses = iter(losses)

    def loss(self, logits, tgt_out):
        return logits.sum() * 0.0 + next(self.losses)


def _scripted_run(make_cfg, tmp_path, monkeypatch, losses, *overrides):
    cfg = make_cfg("group=postln", f"train.steps={len(losses)}", "train.explode_factor=4", *overrides)
    task = ScriptedLosses(losses, cfg.task.vocab_size, cfg.task.seq_len, 0, torch.device("cpu"), batch_size=8)
    monkeypatch.setattr(trainer, "make_task", lambda cfg, device: task)
    return trainer.train(cfg, tmp_path), task


CHANCE = math.log(15)  # vocab_size 16, BOS excluded


@pytest.mark.parametrize("losses, diverged_at", [
    ([3.0, 11.99, 12.0, 2.0], None),           # threshold 4 x max(chance, 3.0) = 12: not above it
    ([3.0, 11.99, 12.01, 2.0], 3),             # just above it
    ([1.0, 4 * CHANCE - 1e-3, 1.0], None),     # a first loss below chance: the threshold is 4 x chance
    ([1.0, 4 * CHANCE + 1e-3, 1.0], 2),
    ([float("nan"), 1.0], 1),                  # not finite at step 1
    ([3.0, float("inf")], 2),
])
def test_the_divergence_threshold_is_explode_factor_times_the_larger_of_chance_and_first_loss(
        make_cfg, tmp_path, monkeypatch, losses, diverged_at):
    summary, _ = _scripted_run(make_cfg, tmp_path, monkeypatch, losses)
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    if diverged_at is None:
        assert summary["status"] == "completed" and summary["steps_done"] == len(losses)
    else:
        assert summary["status"] == "diverged" and summary["diverged_at_step"] == diverged_at
        assert summary["steps_done"] == diverged_at - 1
        assert metrics.step.iloc[-1] == diverged_at  # the diverging loss is the last row
        last = metrics.loss.iloc[-1]
        assert (math.isnan(last) and math.isnan(losses[diverged_at - 1])) or last == pytest.approx(losses[diverged_at - 1])


@pytest.mark.parametrize("losses, diverged_at", [
    ([3.0, 2.0, float("nan"), 2.0, 2.0, 2.0, 2.0, 2.0], 3),   # read at step 5, recorded at 3
    ([3.0, 2.0, 2.0, 2.0, 2.0, 13.0, 2.0, 2.0], 6),           # read at the last step
    ([3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], None),
])
def test_a_gpu_reads_losses_only_at_probe_steps_and_records_the_same_divergence(
        make_cfg, tmp_path, monkeypatch, losses, diverged_at):
    """On CUDA the host does not read each step's loss (no stall per step); the record is the
    one a CPU run writes, reading every loss: same status, step and rows."""
    overrides = ["probe.first_steps=0", "probe.every=5", "train.eval_every=5"]
    every_step, _ = _scripted_run(make_cfg, tmp_path / "cpu", monkeypatch, losses, *overrides)
    reads = []
    real_read = Run.read_losses
    monkeypatch.setattr(stabexp.train.build, "reads_loss_every_step", lambda device: False)
    monkeypatch.setattr(Run, "read_losses", lambda self: reads.append(len(self.pending_losses)) or real_read(self))
    lazy, _ = _scripted_run(make_cfg, tmp_path / "gpu", monkeypatch, losses, *overrides)
    assert max(reads) > 1  # several steps' losses in one read
    for key in ("status", "diverged_at_step", "steps_done", "first_loss", "last_loss", "final_eval_loss"):
        assert lazy[key] == every_step[key] or (math.isnan(lazy[key]) and math.isnan(every_step[key]))
    assert lazy["diverged_at_step"] == diverged_at
    columns = ["step", "lr", "loss", "grad_norm", "model_update", "eval_loss"]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "gpu" / "metrics.csv")[columns],
                                  pd.read_csv(tmp_path / "cpu" / "metrics.csv")[columns])


@pytest.mark.parametrize("status, skipped", [
    ("completed", True), ("diverged", True),
    ("running", False), ("failed", False), ("interrupted", False), ("unreadable", None),
])
def test_which_earlier_runs_are_left_alone(make_cfg, tmp_path, status, skipped):
    """A finished run is left as it is, an unfinished one run again; a summary.json that is not a
    run's (stabexp writes it atomically, so not one of its own) is refused until overwrite=true."""
    from stabexp.config import ConfigError

    (tmp_path / "metrics.csv").write_text("left from before\n")
    summary_file = tmp_path / "summary.json"
    summary_file.write_text("{not json" if status == "unreadable" else json.dumps({"status": status}))
    if skipped is None:
        with pytest.raises(ConfigError, match="is not a run's summary .*overwrite=true replaces it"):
            trainer.train(make_cfg("group=postln"), tmp_path)
        assert (tmp_path / "metrics.csv").read_text() == "left from before\n"
        assert trainer.train(make_cfg("group=postln", "overwrite=true"), tmp_path)["steps_done"] == 6
        return
    summary = trainer.train(make_cfg("group=postln"), tmp_path)
    if skipped:
        assert summary == {"status": status}
        assert (tmp_path / "metrics.csv").read_text() == "left from before\n"
    else:
        assert summary["status"] == "completed" and summary["steps_done"] == 6
        assert json.loads(summary_file.read_text())["status"] == "completed"
        assert pd.read_csv(tmp_path / "metrics.csv").step.iloc[-1] == 6


def test_an_unexpected_error_is_recorded_as_failed_and_raised(make_cfg, tmp_path, monkeypatch):
    def broken(self, n=None):
        raise RuntimeError("the data went away")

    monkeypatch.setattr(SymbolTask, "train_batch", broken)
    with pytest.raises(RuntimeError, match="the data went away"):
        trainer.train(make_cfg("group=postln"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "the data went away" in summary["error"]
    assert "RuntimeError: the data went away" in (tmp_path / "error.txt").read_text()


@pytest.mark.slow
def test_a_failed_run_exits_non_zero_through_the_cli(tmp_path):
    """The CLI in a subprocess whose training batches raise: a failed run, exit code 1."""
    import os
    import subprocess
    import sys

    code = ("import sys; import stabexp.data.symbols as s\n"
            "def broken(self, n=None): raise RuntimeError('the data went away')\n"
            "s.SymbolTask.train_batch = broken\n"
            "from stabexp.cli import main\n"
            f"sys.exit(main(['run', *{TINY!r}]))")
    env = dict(os.environ, STABEXP_OUTPUTS=str(tmp_path / "outputs"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0
    run = next((tmp_path / "outputs" / "runs").iterdir())
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    assert "the data went away" in (run / "error.txt").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_one_line_and_no_run(stabexp_cli):
    r = stabexp_cli("run", *TINY, "train.device=cuda")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("stabexp: error: train.device=cuda is not allowed here")
    assert not list(stabexp_cli.outputs.rglob("summary.json"))  # Hydra's own .hydra/ aside


def _full_disk_at_checkpoints(monkeypatch):
    import errno

    from stabexp.train import checkpoint

    def no_space(out_dir, *args, **kwargs):
        raise OSError(errno.ENOSPC, f"No space left on device: {out_dir}/checkpoint.pt was not written")

    monkeypatch.setattr(checkpoint, "save", no_space)


def test_a_full_disk_is_one_line_and_the_run_is_recorded_failed(stabexp_main, monkeypatch):
    _full_disk_at_checkpoints(monkeypatch)
    r = stabexp_main("run", *TINY, "train.checkpoint_every=2")
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.startswith("stabexp: error:")]
    assert len(lines) == 1 and "the disk is full" in lines[0] and "resumes" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    summary = json.loads(next(stabexp_main.outputs.glob("runs/*/summary.json")).read_text())
    assert summary["status"] == "failed" and "No space left" in summary["error"]


def test_a_full_disk_ends_a_job_of_a_sweep_in_one_line(stabexp_main, monkeypatch):
    _full_disk_at_checkpoints(monkeypatch)
    r = stabexp_main("run", "-m", *TINY, "train.checkpoint_every=2", "group=postln,preln", "hydra/launcher=basic")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "2 job(s) of the sweep did not finish" in r.stderr and r.stderr.count("the disk is full") >= 2
