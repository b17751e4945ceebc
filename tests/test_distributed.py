"""One run on K processes (stabexp.distributed): DDP and FSDP2 on 2 gloo ranks give the
one-process run's numbers to fp32 rounding, a run killed on both ranks resumes to the files of
an uninterrupted one, only rank 0 writes, and bad input is one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn

from conftest import TINY, WALL, assert_same_files, cli_env
from corpus import translation_overrides
from ranks import call_on_ranks, run_ranks
from stabexp import distributed
from stabexp.compose import compose
from stabexp.config import ConfigError, validate_world
from stabexp.data import make_task, prepare
from stabexp.train.trainer import train

# Probes at every step, an eval every 4, no dropout: every column a run writes is compared.
RUN = [*TINY, "group=preln", "model.dropout=0.0", "train.steps=20", "probe.first_steps=0", "probe.every=1",
       "train.eval_every=4", "train.checkpoint_every=5", "train.device=cpu"]
# The parity runs take SGD with momentum: Adam's first updates are about lr * sign(g), so a
# rounding difference in a gradient near 0 flips a weight's update by 2 lr, and the runs part by
# more than rounding within a few steps whatever the reduction (the resume tests keep Adam).
PARITY = ["optim=sgdm", "train.lr=0.1", "train.clip_norm=0.5", "train.z_loss=1e-4"]  # clipping, z-loss too
# Columns of different runs that agree only to rounding (sums over shards are re-associated).
CLOSE = dict(check_exact=False, rtol=2e-4, atol=2e-5)


def compose_cfg(*overrides):
    return compose([*RUN, *overrides])


def assert_close_files(a: Path, b: Path, note: str) -> None:
    for name in ("metrics.csv", "layers.csv"):
        x, y = pd.read_csv(a / name), pd.read_csv(b / name)
        x, y = x.drop(columns=[c for c in WALL if c in x]), y.drop(columns=[c for c in WALL if c in y])
        pd.testing.assert_frame_equal(x, y, obj=f"{name} {note}", **CLOSE)


# --- without processes ----------------------------------------------------------------------

def test_the_world_is_checked_with_one_line():
    cfg = compose_cfg("train.parallel=ddp")
    with pytest.raises(ConfigError, match=r"train.parallel=ddp is not allowed: needs a process group: torchrun"):
        validate_world(cfg, 1, grouped=False)
    validate_world(cfg, 1, grouped=True)  # torchrun --nproc-per-node=1: DDP of one
    with pytest.raises(ConfigError, match=r"train.parallel=none is not allowed: must be ddp or fsdp on 2"):
        validate_world(compose_cfg(), 2, grouped=True)
    with pytest.raises(ConfigError, match=r"train.batch_size=7 is not allowed: must be a multiple of the 2"):
        validate_world(compose_cfg("train.parallel=ddp", "train.batch_size=7"), 2, grouped=True)
    from stabexp.config import validate

    with pytest.raises(ConfigError, match="train.parallel=pipeline is not allowed: one of none, ddp, fsdp"):
        validate(compose_cfg("train.parallel=pipeline"))
    with pytest.raises(ConfigError, match="probe.layer_importance=True is not allowed: must be false with "
                                          "train.parallel=fsdp on task.kind=translation"):
        validate(compose_cfg("train.parallel=fsdp", "probe.layer_importance=true", "task=multi30k"))


def test_fsdp_names_a_scalar_parameter_it_cannot_shard():
    model = nn.Sequential(nn.Linear(2, 2))
    model.gain = nn.Parameter(torch.tensor(1.0))
    with pytest.raises(ConfigError, match="parameter gain is a 0-dim scalar, which fully_shard cannot shard"):
        distributed.wrap(model, "fsdp", torch.device("cpu"))


def test_fsdp_finds_a_scalar_parameter_on_the_meta_device(monkeypatch):
    """A model of the user's with a 0-dim parameter: train() checks it before it takes the lock
    or writes anything, from the model built on the meta device."""
    import stabexp.train.build as run_module

    real = run_module.build_model

    def with_scalar(*args, **kwargs):
        model = real(*args, **kwargs)
        model.gain = nn.Parameter(torch.tensor(1.0))
        return model
    monkeypatch.setattr(run_module, "build_model", with_scalar)
    with pytest.raises(ConfigError, match="train.parallel=fsdp: parameter gain is a 0-dim scalar"):
        run_module.check_parallel(compose_cfg("train.parallel=fsdp"), make_task(compose_cfg(), torch.device("cpu")))


@pytest.mark.parametrize("kind", ["sort", "masked_lm", "translation"])
def test_the_shares_of_a_batch_add_up_to_its_mean_loss_and_gradient(kind, corpus_dir, monkeypatch):
    """Each rank's rows, their summed loss over the whole batch's count: the K parts add up to
    the one-process mean loss and gradient (padded translation rows, a masked LM's varying
    count, and a rank with no rows at all, weighted 0)."""
    from stabexp.model import build_model

    overrides = {"sort": [], "masked_lm": ["task=lm", "model.arch=encoder_only"],
                 "translation": [*translation_overrides(corpus_dir), "train.label_smoothing=0.1"]}[kind]
    cfg = compose_cfg(*overrides)
    prepare(cfg)
    task = make_task(cfg, torch.device("cpu"))
    torch.manual_seed(0)
    model = build_model(cfg, task.vocab_size, task.pad_id, task.max_positions)
    batch = task.train_batch()
    if kind == "translation":
        batch = tuple(t[:3] for t in batch)  # 3 rows on 4 ranks: one rank has none

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    mean = task.loss(model(*batch[:2]), batch[2])
    expected = grads(mean)
    world = 4 if kind == "translation" else 2
    count = task.predicted(batch[2]).sum()
    total, grad = 0.0, 0.0
    for r in range(world):
        monkeypatch.setattr(distributed, "world", lambda: world)
        monkeypatch.setattr(distributed, "rank", lambda r=r: r)
        (src, tgt_in, tgt_out), weight = distributed.share(batch)
        part = task.loss_sum(model(src, tgt_in), tgt_out) / count * weight
        total, grad = total + part.item(), grad + grads(part)
    assert total == pytest.approx(mean.item(), rel=1e-6)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)


def test_a_process_group_is_found_from_torchrun_submitit_or_srun(monkeypatch):
    for key in ("WORLD_SIZE", "SUBMITIT_LOCAL_NTASKS", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(key, raising=False)
    assert not distributed.launched()
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert not distributed.launched()  # a lone process of a SLURM job
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    assert distributed.launched()  # one of 4 srun tasks
    monkeypatch.delenv("SLURM_PROCID")
    monkeypatch.setenv("SUBMITIT_LOCAL_NTASKS", "2")
    assert distributed.launched()
    monkeypatch.delenv("SUBMITIT_LOCAL_NTASKS")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.launched()  # torchrun --nproc-per-node=1


# --- on 2 ranks (spawned) -------------------------------------------------------------------

@pytest.fixture(scope="module")
def translation_corpus(tmp_path_factory):
    from corpus import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus") / "toy")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, translation_corpus):
    """The reference runs, in this process: the sort task, and padded translation batches of a
    token budget (shares of uneven size)."""
    out = tmp_path_factory.mktemp("one_process")
    tasks = {"sort": PARITY, "translation": [*PARITY, *translation_overrides(translation_corpus),
                                             "task.bleu_sentences=8"]}
    for name, overrides in tasks.items():
        cfg = compose_cfg(*overrides)
        prepare(cfg)
        train(cfg, out / name)
    return out, tasks


# make test-fast keeps one 2-rank run (DDP on the sort task); make test runs them all.
SLOW = pytest.mark.slow


@pytest.mark.parametrize("parallel, task, extra", [
    ("ddp", "sort", []), pytest.param("fsdp", "sort", [], marks=SLOW),
    pytest.param("fsdp", "sort", ["train.activation_checkpointing=true"], marks=SLOW, id="fsdp-sort-recompute"),
    pytest.param("ddp", "translation", [], marks=SLOW), pytest.param("fsdp", "translation", [], marks=SLOW),
    *[pytest.param(parallel, "sort", ["train.batch_size=4", "train.update_freq=2"], marks=SLOW,
                   id=f"{parallel}-sort-two-batches-per-step") for parallel in ("ddp", "fsdp")]])
def test_two_ranks_give_the_one_process_numbers(parallel, task, extra, one_process, tmp_path):
    """Loss, gradient norms per sublayer, LN input norms, attention logits, the model update,
    eval loss and BLEU of 20 steps on 2 ranks against one process: fp32 rounding apart. A
    gradient reduced as a SUM where an AVG is meant (pytorch/pytorch#162338) doubles them.
    FSDP2 with each layer's activations recomputed in the backward (activation checkpointing
    composed with the per-layer all-gather) gives the same numbers, and so do two batches of
    half the rows per step (train.update_freq=2: DDP reduces once, after the last batch;
    FSDP2 adds each batch's reduced shards)."""
    reference, tasks = one_process
    out = tmp_path / "run"
    run_ranks(compose_cfg(*tasks[task], f"train.parallel={parallel}", *extra), out)
    assert_close_files(reference / task, out, f"{parallel} {task}")
    summary = json.loads((out / "summary.json").read_text())
    one = json.loads((reference / task / "summary.json").read_text())
    assert (summary["status"], summary["world_size"], summary["parallel"]) == ("completed", 2, parallel)
    for key in ("final_eval_loss", "test_loss", "valid_bleu", "test_bleu"):
        if key in one:
            assert summary[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), key
    if task == "translation":
        assert (out / "test_translations.tsv").read_text() == (reference / task / "test_translations.tsv").read_text()
    # One folder, rank 0's files (ranks.py fails a rank > 0 that opens a file there to write).
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (reference / task).iterdir())


# The weight-matrix probes, whose numbers under FSDP are sums over row shards (and spectral
# norms of matrices gathered one at a time).
MATRIX_PROBES = ["group=deepnorm", "probe.weights=true", "probe.update_bound=true"]


@SLOW
def test_every_probe_and_qk_clip_on_shards_give_the_one_process_numbers(tmp_path):
    """probe.weights (norms, angular updates, row angles, gradient norms of every matrix),
    probe.update_bound (spectral and Frobenius terms of DeepNet's bound), probe.at_init (the
    output change of a perturbation drawn whole and applied to each rank's rows; the gradient at
    init from shards), probe.dependency, probe.layer_importance and QK-Clip (rows of the fused
    QKV projection rescaled on the rank that holds them) under FSDP on 2 ranks against one
    process: fp32 rounding apart."""
    # Below the logits of the first steps: every head is clipped. And the layer importance, whose
    # eval passes run layer by layer on every rank.
    extra = ["train.qk_clip_tau=0.05", "probe.layer_importance=true", "probe.at_init=true", "probe.dependency=true"]
    cfg = compose_cfg(*PARITY, *MATRIX_PROBES, *extra)
    prepare(cfg)
    train(cfg, tmp_path / "one")
    run_ranks(compose_cfg(*PARITY, *MATRIX_PROBES, *extra, "train.parallel=fsdp"), tmp_path / "fsdp")
    assert pd.read_csv(tmp_path / "one" / "layers.csv")["max_attn_logit"].max() > 0.05
    assert_close_files(tmp_path / "one", tmp_path / "fsdp", "fsdp weights, update bound")
    for name in ("update_bound.csv", "layer_importance.csv", "dependency.csv"):
        x, y = (pd.read_csv(tmp_path / d / name) for d in ("one", "fsdp"))
        pd.testing.assert_frame_equal(x, y, obj=name, **CLOSE)
    assert pd.read_csv(tmp_path / "fsdp" / "layers.csv")["angular_update"].notna().sum() > 0


def _bf16_sharded(yaml, out):
    """A bf16 FSDP2 model: its parameters stay fp32 shards (the optimiser's master weights), the
    forward computes on bf16 gathers and the gradients arrive in fp32."""
    from omegaconf import OmegaConf

    from stabexp.train.build import model_for

    cfg = OmegaConf.create(yaml)
    cpu = torch.device("cpu")
    task = make_task(cfg, cpu)
    torch.manual_seed(cfg.seed)
    model = model_for(cfg, task, cpu)
    src, tgt_in, tgt_out = task.train_batch()
    seen = []
    linear = next(m for m in model.encoder[0].modules() if isinstance(m, nn.Linear))
    handle = linear.register_forward_pre_hook(lambda m, args: seen.append(m.weight.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        task.loss(model(src, tgt_in), tgt_out).backward()
    handle.remove()
    dtypes = {"shards": sorted({str(p.dtype) for p in model.parameters()}),
              "grads": sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None}),
              "gathered": [str(d) for d in seen]}
    if distributed.rank() == 0:
        torch.save(dtypes, out)


@SLOW
def test_bf16_under_fsdp_is_bf16_compute_on_fp32_master_weights(tmp_path):
    cfg = compose_cfg("train.parallel=fsdp", "train.precision=bf16")
    prepare(cfg)
    from omegaconf import OmegaConf

    call_on_ranks(_bf16_sharded, OmegaConf.to_yaml(cfg), str(tmp_path / "dtypes.pt"))
    dtypes = torch.load(tmp_path / "dtypes.pt")
    assert dtypes == {"shards": ["torch.float32"], "grads": ["torch.float32"], "gathered": ["torch.bfloat16"]}
    # And a run of it trains: on the fp32 run's path, to bf16's rounding.
    run_ranks(cfg, tmp_path / "bf16")
    one = compose_cfg("train.precision=bf16")
    train(one, tmp_path / "one")
    x, y = (pd.read_csv(tmp_path / d / "metrics.csv")["loss"].dropna() for d in ("one", "bf16"))
    assert json.loads((tmp_path / "bf16" / "summary.json").read_text())["status"] == "completed"
    assert (x - y).abs().max() < 0.05 * x.abs().max()


# Every init rule, and the placements whose constructors set values of their own (ReZero's
# alpha, DLCL's history, NormFormer's head scales, DyT's alpha, Fixup's scalars).
SHARDED_INIT = ["postln", "postln_init", "deepnorm", "deepnorm_torchscale", "admin", "admin_closed_form", "ds_init",
                "fixup", "t_fixup", "subln", "rezero", "dlcl", "normformer", "dyt"]


def _initialised(cfg):
    """(every parameter whole, the init's constants, the random state after it) of the run's
    model as train() builds it, sharded or not."""
    from stabexp.train.build import describe, model_for

    cpu = torch.device("cpu")
    task = make_task(cfg, cpu)
    torch.manual_seed(cfg.seed)
    task.probe_batch()
    model = model_for(cfg, task, cpu)
    summary = {}
    describe(cfg, model, task, cpu, summary)
    params = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
              for name, p in model.named_parameters()}
    sharded = all(hasattr(p, "full_tensor") for p in model.parameters())
    return params, summary["constants"], torch.get_rng_state(), sharded


def _initialise_sharded(yamls, out):
    from omegaconf import OmegaConf

    got = [_initialised(OmegaConf.create(y)) for y in yamls]
    if distributed.rank() == 0:
        torch.save(got, out)


def test_the_sharded_init_is_the_unsharded_one_bit_for_bit(tmp_path):
    """Under FSDP each layer is sharded as it is built and the init rule runs on the shards
    (distributed.build_sharded, whole_draws): on 2 ranks, every parameter, constant (Admin's
    profiled omegas too) and the random state after the init equal one process's exactly."""
    from omegaconf import OmegaConf

    cfgs = [compose_cfg(f"group={g}", "depth=3", "train.parallel=fsdp") for g in SHARDED_INIT]
    cfgs.append(compose_cfg("group=deepnorm", "model.arch=decoder_only", "task=lm", "train.parallel=fsdp"))
    for cfg in cfgs:
        prepare(cfg)
    call_on_ranks(_initialise_sharded, [OmegaConf.to_yaml(c) for c in cfgs], str(tmp_path / "sharded.pt"))
    for cfg, (params, constants, rng, sharded) in zip(cfgs, torch.load(tmp_path / "sharded.pt", weights_only=False)):
        cfg.train.parallel = "none"
        want, want_constants, want_rng, _ = _initialised(cfg)
        assert sharded, cfg.group.name
        assert [n for n in want if not torch.equal(want[n], params[n])] == [], cfg.group.name
        assert (constants, torch.equal(rng, want_rng)) == (want_constants, True), cfg.group.name


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_run_killed_on_both_ranks_resumes_to_the_same_files(parallel, tmp_path):
    # each rank's dropout stream too, and the update bound's theta_0 (DCP's under FSDP)
    cfg = compose_cfg(f"train.parallel={parallel}", "model.dropout=0.1", *MATRIX_PROBES)
    run_ranks(cfg, tmp_path / "whole")
    run_ranks(cfg, tmp_path / "killed", exit_after=13)  # the last checkpoint is step 10's
    state = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert state["status"] == "running" and state["checkpoint_step"] == 10
    assert (tmp_path / "killed" / "checkpoint" / "model_and_optim").is_dir()
    run_ranks(cfg, tmp_path / "killed")
    assert_same_files(tmp_path / "whole", tmp_path / "killed", parallel)
    assert not (tmp_path / "killed" / "checkpoint").exists()


@pytest.mark.slow
def test_a_sharded_checkpoint_is_read_without_running_code_and_a_whole_tmp_one_is_resumed(tmp_path):
    """A planted DCP metadata file is refused on every rank and never run; a kill that fell
    after checkpoint.tmp/ was whole and before the renames (no checkpoint/ beside it) resumes
    from it, not from step 0."""
    import pickle

    from test_run_folders import Payload

    cfg = compose_cfg("train.parallel=ddp")
    run_ranks(cfg, tmp_path / "whole")
    killed = tmp_path / "killed"
    run_ranks(cfg, killed, exit_after=13)  # the last checkpoint is step 10's
    metadata = killed / "checkpoint" / "model_and_optim" / ".metadata"
    kept = metadata.read_bytes()
    metadata.write_bytes(pickle.dumps(Payload(tmp_path / "ran")))
    with pytest.raises(Exception, match="other than DCP's metadata"):
        run_ranks(cfg, killed)
    assert not (tmp_path / "ran").exists()
    metadata.write_bytes(kept)
    (killed / "checkpoint").rename(killed / "checkpoint.tmp")
    run_ranks(cfg, killed)
    assert json.loads((killed / "summary.json").read_text())["resumed_from"] == [10]
    assert_same_files(tmp_path / "whole", killed, "resumed from checkpoint.tmp/")


@pytest.mark.slow
def test_a_diverged_run_stops_on_every_rank_at_the_one_process_step(tmp_path):
    cfg = compose_cfg("optim=sgd", "train.lr=200", "train.warmup_steps=0")
    train(cfg, tmp_path / "one")
    run_ranks(compose_cfg("optim=sgd", "train.lr=200", "train.warmup_steps=0", "train.parallel=ddp"),
              tmp_path / "two")
    one, two = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert one["status"] == two["status"] == "diverged"
    assert one["diverged_at_step"] == two["diverged_at_step"]


@pytest.mark.slow
def test_a_checkpoint_of_two_ranks_is_resumed_by_two_only(tmp_path):
    cfg = compose_cfg("train.parallel=ddp")
    run_ranks(cfg, tmp_path / "killed", exit_after=7)
    with pytest.raises(Exception, match=r"written by 2 processes, this run has 1: resume it with torchrun "
                                        r"--nproc-per-node=2"):
        run_ranks(cfg, tmp_path / "killed", world=1)
    with pytest.raises(ConfigError, match=r"holds a run of another config \(train.parallel: \"ddp\" in the folder, "
                                          r"\"none\" here\)"):
        train(compose_cfg(), tmp_path / "killed")


# --- through torchrun -----------------------------------------------------------------------

def torchrun(outputs, *args, nproc=2, **kwargs):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "stabexp", "run", *args]
    env = dict(cli_env(outputs), STABEXP_DIST_TIMEOUT_S="60", OMP_NUM_THREADS="1")
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, **kwargs)


def finish(process, timeout=300):
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return process.returncode, out, err


def one_stabexp_line(err: str, *words) -> None:
    """torchrun prints its own report after a failed worker: of ours, one line."""
    lines = [line for line in err.splitlines() if line.startswith("stabexp:")]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in err.split("stabexp:", 1)[0], err


@pytest.mark.slow
def test_torchrun_runs_one_folder_written_by_rank_0(tmp_path):
    args = [*TINY, "train.device=cpu", "model.dropout=0.0", "train.parallel=ddp",
            "hydra.run.dir=" + str(tmp_path / "outputs" / "the_run")]
    code, out, err = finish(torchrun(tmp_path / "outputs", *args))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["the_run"]
    folder = tmp_path / "outputs" / "the_run"
    assert sorted(p.name for p in folder.iterdir()) == [".hydra", "config.yaml", "layers.csv", "metrics.csv",
                                                       "stabexp.log", "summary.json"]
    assert json.loads((folder / "summary.json").read_text())["world_size"] == 2
    assert (folder / "stabexp.log").read_text().count("completed after 6 steps") == 1
    assert "broadcast_buffers" not in err, err  # torch 2.13's FutureWarning for DDP's old switch


@pytest.mark.slow
def test_torchrun_bad_input_is_one_line(tmp_path, stabexp_main):
    r = stabexp_main("run", *TINY, "train.parallel=ddp")
    assert r.returncode == 2 and "train.parallel=ddp is not allowed: needs a process group" in r.stderr
    code, _, err = finish(torchrun(tmp_path / "outputs", *TINY, "train.parallel=ddp", "train.batch_size=7",
                                   "train.device=cpu"))
    assert code != 0
    one_stabexp_line(err, "train.batch_size=7 is not allowed", "multiple of the 2 processes")
    code, _, err = finish(torchrun(tmp_path / "outputs", *TINY, "train.device=cpu", "train.steps=0x"))
    assert code != 0
    one_stabexp_line(err, "train.steps", "0x")
    code, _, err = finish(torchrun(tmp_path / "outputs", *TINY, "train.device=cpu", "train.parallel=ddp",
                                   "hydra.run.dir=" + str(tmp_path / "outputs" / "${now:%H-%M-%S}")))
    assert code != 0
    one_stabexp_line(err, "${now:...}", "fixed path")
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.csv"))


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_the_run_resumes(tmp_path):
    args = [*TINY, "train.device=cpu", "train.parallel=ddp", "train.steps=200", "probe.every=5",
            "train.eval_every=50", "model.dropout=0.1", "train.checkpoint_every=0"]
    code, _, err = finish(torchrun(tmp_path / "whole", *args, "hydra.run.dir=" + str(tmp_path / "whole" / "run")))
    assert code == 0, err
    folder = tmp_path / "stopped" / "run"
    first = torchrun(tmp_path / "stopped", *args, "hydra.run.dir=" + str(folder))
    deadline = time.monotonic() + 120
    while not (folder / "metrics.csv").exists() or len((folder / "metrics.csv").read_text().splitlines()) < 12:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks
    code, _, err = finish(first)
    assert code != 0
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGTERM", err
    assert 0 < summary["checkpoint_step"] < 200
    code, _, err = finish(torchrun(tmp_path / "stopped", *args, "hydra.run.dir=" + str(folder)))
    assert code == 0, err
    assert_same_files(tmp_path / "whole" / "run", folder, "SIGTERM through torchrun")


@pytest.mark.slow
def test_a_second_torchrun_on_a_folder_in_use_stops_with_one_line(tmp_path):
    args = [*TINY, "train.device=cpu", "train.parallel=ddp", "train.steps=3000", "probe.every=1000",
            "hydra.run.dir=" + str(tmp_path / "outputs" / "busy")]
    first = torchrun(tmp_path / "outputs", *args)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "outputs" / "busy" / "metrics.csv").exists():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.5)
        busy = tmp_path / "outputs" / "busy"
        hydra_files = {p: p.stat().st_mtime_ns for p in (busy / ".hydra").iterdir()}
        log_size = (busy / "stabexp.log").stat().st_size
        code, _, err = finish(torchrun(tmp_path / "outputs", *args))
        assert code != 0
        one_stabexp_line(err, "is being run by")
        # Refused before Hydra writes: .hydra/ untouched (Hydra would rewrite it, same bytes).
        assert {p: p.stat().st_mtime_ns for p in (busy / ".hydra").iterdir()} == hydra_files
        assert "is being run by" not in (busy / "stabexp.log").read_text()[log_size:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


@pytest.mark.slow
def test_a_submitit_job_of_two_tasks_is_the_torchrun_run(tmp_path):
    """Hydra's submitit launcher with tasks_per_node=2 (locally here; on SLURM the same code
    reads srun's variables): one run on 2 processes, the files of the torchrun run."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the launchers extra")
    from conftest import cli_command

    args = [*TINY, "train.device=cpu", "model.dropout=0.0", "train.parallel=ddp"]
    code, _, err = finish(torchrun(tmp_path / "torchrun", *args, "hydra.run.dir=" + str(tmp_path / "torchrun" / "run")))
    assert code == 0, err
    env = dict(cli_env(tmp_path / "submitit"), STABEXP_DIST_TIMEOUT_S="60", OMP_NUM_THREADS="1")
    done = subprocess.run(cli_command("run", "-m", *args, "hydra/launcher=submitit_local",
                                      "hydra.launcher.tasks_per_node=2"),
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    job = next(p for p in next((tmp_path / "submitit" / "multirun").iterdir()).iterdir()
               if p.is_dir() and not p.name.startswith("."))
    assert json.loads((job / "summary.json").read_text())["world_size"] == 2
    assert_same_files(tmp_path / "torchrun" / "run", job, "submitit against torchrun")


def test_the_documented_torchrun_and_srun_commands_pass_the_checks(monkeypatch):
    """The commands of docs/scale.md and the README that start K processes: their `stabexp run`
    part passes what preflight checks on each of the K ranks."""
    import re

    from stabexp.preflight import preflight

    root = Path(__file__).parents[1]
    pages = (root / "docs" / "scale.md").read_text() + (root / "README.md").read_text()
    lines = [line for line in pages.splitlines() if line.startswith(("torchrun ", "srun "))]
    assert len(lines) == 5  # the memory measurement's two among them
    for line in lines:
        k = int(re.search(r"--nproc-per-node=(\d+)", line).group(1)) if line.startswith("torchrun") else \
            int(re.search(r"--nodes=(\d+)", line).group(1)) * int(re.search(r"--ntasks-per-node=(\d+)", line).group(1))
        monkeypatch.setattr(distributed, "active", lambda: True)
        monkeypatch.setattr(distributed, "world", lambda k=k: k)
        preflight(line.split("stabexp run ", 1)[1].split(), prepare_data=False)
