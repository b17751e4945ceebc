"""stabexp plan: the run's model, optimiser and probes traced under FakeTensorMode on a fake
process group, counted by torch's memory trackers (src/stabexp/plan.py)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY
from stabexp.cli import main
from stabexp.config import compose
from stabexp.plan import KINDS, trace

BASE = [*TINY, "group=deepnorm", "train.device=cpu"]
RUN = [*BASE, "depth=2"]


@pytest.mark.parametrize("world, parallel", [(1, "none"), (2, "ddp"), (2, "fsdp")])
def test_the_fake_trace_counts_what_real_tensors_hold(world, parallel):
    """The same steps on real tensors (the fake process group's collectives still return at
    once): every kind of memory and the FLOPs agree; what FakeTensorMode cannot run in place
    (fused optimisers, stabexp.plan.per_tensor) would show here as a second copy of the model."""
    cfg = compose([*RUN, f"train.parallel={parallel}", "probe.weights=true", "probe.update_bound=true"])
    fake, real = trace(cfg, world), trace(cfg, world, fake=False)
    assert fake["flops"] == real["flops"] > 0
    for kind in (*KINDS, "peak"):
        assert fake[kind] == pytest.approx(real[kind], rel=0.01, abs=2 ** 12), kind
    assert fake["parameter_count"] == real["parameter_count"]


def test_fsdp_holds_a_share_of_the_training_state():
    one = trace(compose([*RUN, "train.parallel=fsdp"]), 1)
    four = trace(compose([*RUN, "train.parallel=fsdp"]), 4)
    assert four["optimiser state"] == pytest.approx(one["optimiser state"] / 4, rel=0.05)
    assert four["gradients"] == pytest.approx(one["gradients"] / 4, rel=0.05)


def test_a_deep_model_is_traced_shallow_and_extrapolated(capsys):
    assert main(["plan", *BASE, "depth=30", "--world=2", "train.parallel=fsdp", "--json"]) == 0
    extrapolated = json.loads(capsys.readouterr().out)
    assert extrapolated["extrapolated"] and extrapolated["traced"] == [8, 16, 24]
    assert main(["plan", *BASE, "depth=30", "--world=2", "train.parallel=fsdp", "--json", "--full-trace"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert not traced["extrapolated"] and traced["parameter_count"] == extrapolated["parameter_count"]
    for kind in ("optimiser state", "gradients", "peak"):
        assert extrapolated[kind] == pytest.approx(traced[kind], rel=0.02), kind


def test_the_table_names_the_run_and_whether_it_fits(capsys):
    assert main(["plan", *RUN, "--world", "2", "train.parallel=fsdp", "--gpu-memory", "0.0001", "--gpu", "a100"]) == 0
    out = capsys.readouterr().out
    assert "deepnorm, depth 2" in out and "2 rank(s), parallel=fsdp" in out
    assert "fits in 0.0001 GiB: NO" in out
    assert "on one A100 (19.5 TFLOP/s fp32)" in out


@pytest.mark.parametrize("args, line", [
    (["optim=nope"], "optim=nope"),
    (["--world=3", "train.parallel=fsdp"], "train.batch_size=8 is not allowed: must be a multiple of the 3"),
    (["--world=2"], "train.parallel=none is not allowed: must be ddp or fsdp on 2"),
    (["--world=0"], "--world=0 is not allowed: a number of processes, 1 or more"),
    (["--world=two"], "--world='two' is not allowed"),
    (["--gpu=v100"], "--gpu=v100 is not allowed: a100, h100, h200"),
    (["-m", "seed=0,1"], "stabexp plan plans one run"),
])
def test_bad_input_is_one_line(args, line, capsys):
    assert main(["plan", *RUN, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stabexp: error: ") and line in err and err.count("\n") == 1


def test_a_config_run_refuses_is_refused_with_run_s_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = [*RUN, "train.lr=-1"]
    assert main(["run", *bad]) == 2
    run_line = capsys.readouterr().err
    assert main(["plan", *bad]) == 2
    assert capsys.readouterr().err == run_line
