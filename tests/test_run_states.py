"""The divergence rule at its edges, and which earlier states of a run folder are skipped or run
again (train() on composed configs; the failed run through the CLI, for its exit code)."""

import json
import math

import pandas as pd
import pytest
import torch

import stabexp.train.trainer as trainer
from conftest import TINY
from stabexp.data import ReverseTask


class ScriptedLosses(ReverseTask):
    """The reversal task, with the training loss of each step given in advance (plus zero times
    the logits, so that backward and the optimiser run as usual)."""

    def __init__(self, losses, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses = iter(losses)

    def loss(self, logits, tgt_out):
        return logits.sum() * 0.0 + next(self.losses)


def _scripted_run(make_cfg, tmp_path, monkeypatch, losses):
    cfg = make_cfg("group=postln", f"train.steps={len(losses)}", "train.explode_factor=4")
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


@pytest.mark.parametrize("status, skipped", [
    ("completed", True), ("diverged", True),
    ("running", False), ("failed", False), ("interrupted", False), ("unreadable", False),
])
def test_which_earlier_runs_are_left_alone(make_cfg, tmp_path, status, skipped):
    (tmp_path / "metrics.csv").write_text("left from before\n")
    summary_file = tmp_path / "summary.json"
    summary_file.write_text("{not json" if status == "unreadable" else json.dumps({"status": status}))
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

    monkeypatch.setattr(ReverseTask, "train_batch", broken)
    with pytest.raises(RuntimeError, match="the data went away"):
        trainer.train(make_cfg("group=postln"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "the data went away" in summary["error"]
    assert "RuntimeError: the data went away" in (tmp_path / "error.txt").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA to fail")
def test_a_failed_run_exits_non_zero_through_the_cli(stabexp_cli):
    r = stabexp_cli("run", *TINY, "train.device=cuda")
    assert r.returncode != 0
    run = next((stabexp_cli.outputs / "runs").iterdir())
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    assert (run / "error.txt").read_text().strip()
