"""stabexp plan: the run's model, optimiser and probes traced under FakeTensorMode on a fake
process group, counted by torch's memory trackers (src/stabexp/plan.py)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY
from stabexp.cli import main
from stabexp.compose import compose
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


def test_a_step_of_several_batches_costs_their_flops():
    one, three = (trace(compose([*RUN, f"train.update_freq={n}"]), 1) for n in (1, 3))
    assert three["flops"] == 3 * one["flops"] > 0


def test_fsdp_holds_a_share_of_the_training_state():
    one = trace(compose([*RUN, "train.parallel=fsdp"]), 1)
    four = trace(compose([*RUN, "train.parallel=fsdp"]), 4)
    assert four["optimiser state"] == pytest.approx(one["optimiser state"] / 4, rel=0.05)
    assert four["gradients"] == pytest.approx(one["gradients"] / 4, rel=0.05)


def test_a_deep_model_is_traced_shallow_and_extrapolated(capsys, monkeypatch):
    # The traced depths a third of the plan's own (8, 16, 24 above 24), to keep the suite fast:
    # what is tested is that the figures are linear in depth, at any depth.
    import stabexp.plan as plan_module

    monkeypatch.setattr(plan_module, "TRACE_DEPTH", 8)
    monkeypatch.setattr(plan_module, "TRACE_DEPTHS", (3, 6, 8))
    assert main(["plan", *BASE, "depth=10", "--world=2", "train.parallel=fsdp", "--json"]) == 0
    extrapolated = json.loads(capsys.readouterr().out)
    assert extrapolated["extrapolated"] and extrapolated["traced"] == [3, 6, 8]
    assert main(["plan", *BASE, "depth=10", "--world=2", "train.parallel=fsdp", "--json", "--full-trace"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert not traced["extrapolated"] and traced["parameter_count"] == extrapolated["parameter_count"]
    for kind in ("optimiser state", "gradients", "peak"):
        assert extrapolated[kind] == pytest.approx(traced[kind], rel=0.02), kind


@pytest.mark.parametrize("group", ["postln", "dlcl"])
def test_a_deep_models_parameters_are_counted_without_building_it(group, monkeypatch):
    """Above the traced depths the count is interpolated through three of them: exact for a model
    linear in depth and for DLCL's, quadratic (its weights over every earlier layer); a
    100,000-layer model is never built (minutes and gigabytes even on the meta device). The trace
    is stood in for by the meta-built model's count (the memory figures are test_a_deep_model_...'s)."""
    import torch

    import stabexp.plan as plan_module
    from stabexp.data import make_task
    from stabexp.model import build_model

    def count(cfg):
        assert cfg.depth <= 24, "the deep model was built"
        task = make_task(cfg, torch.device("cpu"))
        with torch.device("meta"):
            return sum(p.numel() for p in build_model(cfg, task.vocab_size, task.pad_id, task.max_positions).parameters())

    monkeypatch.setattr(plan_module, "trace", lambda cfg, world: {"peak": 1.0, "parameter_count": float(count(cfg))})
    deep = compose([*TINY, f"group={group}", "depth=40"])
    assert plan_module.plan(deep, 1)["parameter_count"] == sum(
        p.numel() for p in build_model(deep, *(lambda t: (t.vocab_size, t.pad_id, t.max_positions))(
            make_task(deep, torch.device("cpu")))).parameters())
    assert plan_module.plan(compose([*TINY, f"group={group}", "depth=100000"]), 1)["parameter_count"] > 100000 * 16 * 16


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
    (["--gpu-memory", "nan"], "--gpu-memory=nan is not allowed: the memory of one GPU in GiB"),
    (["--gpu-memory=inf"], "--gpu-memory=inf is not allowed"),
    (["train.batch_size=1000000000000"], "train.batch_size=1000000000000 is too large to plan here"),
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
