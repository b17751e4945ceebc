"""Run folders that can be trusted: nothing in one is ever unpickled, a folder never mixes two
configs, an older version's folder resumes when nothing it computes changed (and a refused or
failed job does not stop its sweep), and inputs that would break a run midway are one line."""

import errno
import json
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

import stabexp.train.trainer as trainer
from conftest import TINY, fail_at_step
from stabexp.config import ConfigError, run_name
from stabexp.train import checkpoint, folder

FIXTURE = Path(__file__).parent / "data" / "run_folders_2026-12-01"
# The command that wrote FIXTURE's sweep under the commit of 2026-12-01 22:40 (ed19cc2), with
# the preln job then re-run by train() and stopped at step 5 (its checkpoint: step 4).
FIXTURE_SWEEP = ["-m", "group=postln,preln", "depth=2", "train.steps=6", "train.checkpoint_every=2",
                 "model.d_model=16", "model.ffn_dim=32"]


def compose_plain(*overrides):
    """The config of `stabexp run OVERRIDES` (no test defaults)."""
    from stabexp.compose import compose

    return compose(overrides)


class Payload:
    """What a hostile pickle does when it is loaded: here, creates the file `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def plant(path: Path, marker: Path) -> None:
    """Replace `path` by a torch file (a zip holding a pickle) whose loading would run code."""
    torch.save({"state": Payload(marker), "format": 1}, path)


def test_the_payload_runs_when_unpickled(tmp_path):
    """The planted file is live: plain torch.load runs it (so the tests below can fail)."""
    plant(tmp_path / "file.pt", tmp_path / "ran")
    torch.load(tmp_path / "file.pt", weights_only=False)
    assert (tmp_path / "ran").exists()


@pytest.fixture
def stopped_run(make_cfg, tmp_path, monkeypatch):
    """A run stopped by a crash at step 5 (checkpoint of step 4), and its config."""
    cfg = make_cfg("group=postln", "train.checkpoint_every=2", "train.steps=8")
    fail_at_step(monkeypatch, cfg, tmp_path / "run", 5)
    return cfg, tmp_path / "run"


def test_a_planted_checkpoint_is_refused_in_one_line_and_never_run(stopped_run, tmp_path):
    cfg, out = stopped_run
    plant(out / checkpoint.CHECKPOINT, tmp_path / "ran")
    with pytest.raises(ConfigError, match="holds objects other than tensors and plain data"):
        trainer.train(cfg, out)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("damage, words", [
    ("metrics.csv", "metrics.csv is shorter"),  # cut below what its checkpoint recorded
    ("layers.csv", "layers.csv begins with the columns 'stepx"),  # a header that is not the run's
])
def test_files_that_do_not_match_their_checkpoint_refuse_the_resume_in_one_line(stopped_run, damage, words):
    """A resume over a metrics.csv shorter than its checkpoint, or a layers.csv whose header
    changed, is refused as a ConfigError naming the file and how to start over (the CLI: one
    line, exit 2), and the checkpoint is kept."""
    cfg, out = stopped_run
    path = out / damage
    if damage == "metrics.csv":
        path.write_text(path.read_text().splitlines()[0] + "\n")
    else:
        path.write_text("stepx" + path.read_text()[len("step"):])
    with pytest.raises(ConfigError, match=re.escape(words) + ".*overwrite=true starts the run over") as refused:
        trainer.train(cfg, out)
    assert "\n" not in str(refused.value)
    assert (out / checkpoint.CHECKPOINT).exists()


@pytest.mark.parametrize("data, words", [(b"", "is empty"), (bytes(range(256)) * 80, "is not a file stabexp wrote"),
                                         (b"PK\x03\x04cut", "cannot be read")])
def test_a_checkpoint_of_no_bytes_or_of_noise_is_one_line(stopped_run, data, words):
    """An empty checkpoint.pt (a write cut short) or one of random bytes: one line naming the
    file and saying what to do, never an IndexError from the refusal or the unpickler."""
    cfg, out = stopped_run
    (out / checkpoint.CHECKPOINT).write_bytes(data)
    with pytest.raises(ConfigError) as refused:
        trainer.train(cfg, out)
    text = str(refused.value)
    assert words in text and str(out / checkpoint.CHECKPOINT) in text and "overwrite=true" in text
    assert "\n" not in text


def test_planted_files_are_never_run_by_any_command(make_cfg, tmp_path, stabexp_main):
    """A sweep of a finished Admin run (with model.pt) and a stopped one (checkpoint.pt):
    the torch files planted, then every command that reads a run folder; then every file of
    both folders planted at once, and the same commands."""
    marker = tmp_path / "ran"
    sweep = stabexp_main.outputs / "multirun" / "planted"
    args = [*TINY, "train.checkpoint_every=2", f"hydra.sweep.dir={sweep}"]
    assert stabexp_main("run", "-m", "group=admin", "train.save_model=true", *args).returncode == 0
    done = next(p for p in sweep.iterdir() if p.is_dir())
    plant(done / "model.pt", marker)
    commands = [["status", str(sweep)], ["report", str(sweep)], ["export", str(done)],
                ["claims", str(sweep), "--json"]]
    for command in commands:
        stabexp_main(*command)
        assert not marker.exists(), command
    for path in done.rglob("*"):
        if path.is_file():
            plant(path, marker)
    for command in commands + [["run", "-m", "group=admin", "train.save_model=true", *args]]:
        stabexp_main(*command)
        assert not marker.exists(), command


def test_dcp_metadata_and_values_are_read_without_running_code(tmp_path):
    """The sharded checkpoint's files through the readers `checkpoint.load_model_and_optimizer`
    uses: DCP's own metadata and values load, a planted .metadata or value is refused."""
    import warnings

    from torch.distributed import checkpoint as dcp

    from torch.distributed.checkpoint.state_dict import get_state_dict

    def stepped():
        model = torch.nn.Linear(3, 2)
        optim = torch.optim.Adam(model.parameters())
        model(torch.ones(1, 3)).sum().backward()
        optim.step()
        return model, optim

    model, optim = stepped()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(dict(zip(("model", "optim"), get_state_dict(model, optim))), checkpoint_id=tmp_path / "ck")
        reader, planner = checkpoint._dcp_classes()
        template = dict(zip(("model", "optim"), get_state_dict(*stepped())))
        dcp.load(template, storage_reader=reader(tmp_path / "ck"), planner=planner())
        assert torch.equal(template["model"]["weight"], model.weight)
        assert template["optim"]["param_groups"][0]["lr"] == 1e-3  # a value (BYTE_IO), not a tensor

        marker = tmp_path / "ran"
        value = next(p for p in (tmp_path / "ck").iterdir() if p.suffix == ".distcp")
        (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
        with pytest.raises(ConfigError, match="other than DCP's metadata"):
            reader(tmp_path / "ck").read_metadata()
        assert not marker.exists() and value.exists()

    bytes_planted = planner()
    buffer = __import__("io").BytesIO()
    torch.save(Payload(marker), buffer)
    buffer.seek(0)
    with pytest.raises(ConfigError, match="other than plain data"):
        bytes_planted.load_bytes(None, buffer)
    assert not marker.exists()


# --- one folder, one config -----------------------------------------------------------------

def test_a_folder_of_another_config_is_refused_and_left_as_is(stabexp_main, tmp_path):
    folder_d = tmp_path / "D"
    first = stabexp_main("run", "group=postln", *TINY, f"hydra.run.dir={folder_d}")
    assert first.returncode == 0
    before = {p.name: p.read_bytes() for p in folder_d.rglob("*") if p.is_file() and p.suffix != ".log"}
    again = stabexp_main("run", "group=preln", *TINY, "depth=3", f"hydra.run.dir={folder_d}")
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    for words in ("holds a run of another config", 'group.name: "postln" in the folder, "preln" here',
                  "depth: 2 in the folder, 3 here", "overwrite=true"):
        assert words in again.stderr
    after = {p.name: p.read_bytes() for p in folder_d.rglob("*") if p.is_file() and p.suffix != ".log"}
    assert after == before  # .hydra/ too: Hydra's record is written only for the folder's own run

    replaced = stabexp_main("run", "group=preln", *TINY, "depth=3", "overwrite=true", f"hydra.run.dir={folder_d}")
    assert replaced.returncode == 0
    summary = json.loads((folder_d / "summary.json").read_text())
    assert (summary["group"], summary["depth"]) == ("preln", 3)
    assert "group=preln" in (folder_d / ".hydra" / "overrides.yaml").read_text()


def test_a_finished_run_of_the_same_config_is_left_as_is(make_cfg, tmp_path):
    cfg = make_cfg("group=postln")
    first = trainer.train(cfg, tmp_path / "run")
    assert first["config_fingerprint"] == folder.fingerprint(cfg)
    assert first["code_versions"] == [folder.code_version()]
    metrics = (tmp_path / "run" / "metrics.csv").read_bytes()
    assert trainer.train(make_cfg("group=postln", "logger=tensorboard"), tmp_path / "run") == first
    assert (tmp_path / "run" / "metrics.csv").read_bytes() == metrics


def test_run_folder_names_differ_where_the_overrides_differ():
    assert run_name(["task.path=/x/a-b"]) != run_name(["task.path=/x/a/b"])
    assert run_name(["x='a b'"]) != run_name(["x=ab"])
    assert run_name(["group=postln", "depth=6"]) == "depth=6__group=postln"  # readable names stay


def test_keys_added_since_a_folder_count_at_their_defaults(make_cfg, monkeypatch):
    from stabexp.config import resolved

    cfg = make_cfg("group=postln")
    recorded = resolved(cfg)
    assert folder.differences(recorded, cfg) == []
    del recorded["train"]["qk_clip_tau"], recorded["group"]["description"]  # added since; text only
    assert folder.differences(recorded, cfg) == []
    assert folder.differences(recorded, make_cfg("group=postln", "train.qk_clip_tau=50")) == [
        "train.qk_clip_tau: 0.0 in the folder, 50.0 here"]
    monkeypatch.setitem(folder.BEFORE_ADDED, "train.qk_clip_tau", 100.0)  # a default that changed behaviour
    assert folder.differences(recorded, cfg) == ["train.qk_clip_tau: 100.0 in the folder, 0.0 here"]
    recorded["train"]["retired_key"] = 1
    assert "train.retired_key: 1 in the folder, no longer a key" in folder.differences(recorded, cfg)


# --- an older version's folders -------------------------------------------------------------

@pytest.fixture
def older_sweep(stabexp_main):
    """FIXTURE's sweep folder, copied under this test's outputs where the sweep's command finds it."""
    target = stabexp_main.outputs / "multirun"
    shutil.copytree(FIXTURE / "multirun", target)
    sweep = next(target.iterdir())
    return sweep, {p.name.split("__")[1]: p for p in sweep.iterdir() if p.is_dir()}


def test_an_older_versions_sweep_resumes_where_it_stopped(older_sweep, stabexp_main, make_cfg, tmp_path):
    sweep, jobs = older_sweep
    finished = (jobs["group=postln"] / "metrics.csv").read_bytes()
    result = stabexp_main("run", *FIXTURE_SWEEP)
    assert result.returncode == 0, result.stderr
    assert (jobs["group=postln"] / "metrics.csv").read_bytes() == finished  # left as it was
    resumed = json.loads((jobs["group=preln"] / "summary.json").read_text())
    assert (resumed["status"], resumed["resumed_from"]) == ("completed", [4])
    assert resumed["code_versions"] == ["unrecorded", folder.code_version()]
    # The same numbers as today's run of the whole config (the columns added since aside).
    fresh = trainer.train(compose_plain(*FIXTURE_SWEEP[2:], "group=preln"), tmp_path / "fresh")
    assert resumed["final_eval_loss"] == fresh["final_eval_loss"]
    import pandas as pd

    old, new = (pd.read_csv(d / "metrics.csv") for d in (jobs["group=preln"], tmp_path / "fresh"))
    common = [c for c in old.columns if c in new.columns and c != "elapsed_s"]
    pd.testing.assert_frame_equal(old[common], new[common])


def test_a_refused_job_is_reported_and_the_sweep_goes_on(older_sweep, stabexp_main, monkeypatch):
    """A key added since whose default is not what the older version ran: both older jobs are
    refused in a line each naming it, and the sweep's third job runs all the same."""
    sweep, jobs = older_sweep
    monkeypatch.setitem(folder.BEFORE_ADDED, "train.qk_clip_tau", 100.0)
    # One job after another in this process, where the monkeypatch reaches (a packed sweep's
    # jobs are processes of their own).
    result = stabexp_main("run", "-m", "group=postln,preln,deepnorm", *FIXTURE_SWEEP[2:],
                          f"hydra.sweep.dir='{sweep}'", "hydra/launcher=basic")
    assert result.returncode == 1
    assert "2 job(s) of the sweep did not finish" in result.stderr
    assert result.stderr.count("train.qk_clip_tau: 100.0 in the folder, 0.0 here") == 2
    deepnorm = next(p for p in sweep.iterdir() if "group=deepnorm" in p.name)
    assert json.loads((deepnorm / "summary.json").read_text())["status"] == "completed"
    assert json.loads((jobs["group=preln"] / "summary.json").read_text())["status"] == "interrupted"


def test_a_failed_job_is_reported_and_the_sweep_goes_on(stabexp_main, monkeypatch):
    real = trainer.Run.step
    monkeypatch.setattr(trainer.Run, "step", lambda self, i: real(self, i) if self.cfg.group.name != "preln"
                        else 1 / 0)
    result = stabexp_main("run", "-m", "group=preln,postln", *TINY, "hydra/launcher=basic")  # as above
    assert result.returncode == 1
    assert "1 job(s) of the sweep did not finish" in result.stderr and "ZeroDivisionError" in result.stderr
    runs = [p for p in (stabexp_main.outputs / "multirun").glob("*/*") if p.is_dir()]
    statuses = {json.loads((p / "summary.json").read_text())["group"]: json.loads(
        (p / "summary.json").read_text())["status"] for p in runs}
    assert statuses == {"preln": "failed", "postln": "completed"}


# --- inputs that passed the checks and broke later ------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["seed=2305843009213693952"], "seed=2305843009213693952 is not allowed: must be an integer in [0, 2^60)"),
    (["hydra.run.dir="], "hydra.run.dir= is empty"),
    (["train.batch_size=100000000"], "train.batch_size=100000000 is not allowed here: one step of it needs at least"),
    # A model whose weights alone cannot fit, at a batch that would.
    (["depth=1000000", "train.batch_size=1"], "depth=1000000 is not allowed here: a model of 1000000/1000000 layers"),
])
def test_bad_inputs_are_one_line_and_write_nothing(stabexp_main, tmp_path, args, words):
    result = stabexp_main("run", "group=postln", "depth=2", "train.steps=2", *args)
    assert result.returncode == 2 and words in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not any((tmp_path / "outputs").rglob("summary.json")) and not (tmp_path / "summary.json").exists()
    # Nor an empty run folder with an empty stabexp.log, which Hydra makes before the checks.
    assert not [p for p in (tmp_path / "outputs").rglob("*") if p.is_file()]


def test_a_group_file_without_a_mandatory_key_is_one_line(stabexp_main, tmp_path):
    (tmp_path / "mine" / "group").mkdir(parents=True)
    (tmp_path / "mine" / "group" / "mine.yaml").write_text("name: mine\nresidual: postln\nschedule: constant\n")
    result = stabexp_main("run", "--config-dir", str(tmp_path / "mine"), "group=mine", "depth=2")
    assert result.returncode == 2
    assert result.stderr == "stabexp: error: group.init has no value: the group file mine.yaml must set it\n"


def test_a_later_run_that_finishes_removes_the_earlier_error_and_stale_temp_files(stopped_run):
    cfg, out = stopped_run
    assert (out / trainer.ERROR).exists()
    stale = out / ".checkpoint.pt.999999.part"
    stale.write_bytes(b"\0" * 1000)  # what a process killed mid-write leaves
    assert trainer.train(cfg, out)["status"] == "completed"
    assert not (out / trainer.ERROR).exists() and not stale.exists()


def test_a_full_disk_is_said_as_such(make_cfg, tmp_path, monkeypatch):
    """torch.save on a full disk says only "unexpected pos"."""
    import stabexp.atomic as atomic

    def full(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 ** 9, 10 ** 9, 0))
    with pytest.raises(OSError, match="No space left on device: .*checkpoint.pt was not written") as err:
        trainer.train(make_cfg("group=postln", "train.checkpoint_every=2"), tmp_path / "run")
    assert err.value.errno == errno.ENOSPC


def test_the_processes_of_one_run_refuse_together(make_cfg, monkeypatch):
    """The memory check reads each process's own memory: when one refuses, all raise its line."""
    from stabexp import distributed

    monkeypatch.setattr(distributed, "gather", lambda obj: [obj, "train.batch_size=8 is not allowed here: rank 1"])
    with pytest.raises(ConfigError, match="rank 1"):
        trainer.check(make_cfg("group=postln"))


def _spoil(summary: Path, kind: str) -> None:
    """summary.json made into something that is not a run's summary."""
    import os

    data = json.loads(summary.read_text())
    if kind in ("dir", "fifo"):
        summary.unlink()
        summary.mkdir() if kind == "dir" else os.mkfifo(summary)
        return
    text = {"optim": lambda: json.dumps(dict(data, optim="adam")), "seed": lambda: json.dumps(dict(data, seed=[1])),
            "number": lambda: "5", "truncated": lambda: json.dumps(data)[:40]}[kind]()
    summary.write_text(text)


@pytest.mark.parametrize("kind", ["optim", "seed", "number", "truncated", "dir", "fifo"])
def test_a_summary_that_is_not_a_runs_is_skipped_by_readers_and_refused_by_a_run(kind, make_cfg, tmp_path, caplog):
    """Hand-edited or foreign summary.json files: every reader (collect, hence the claims and the
    report; status; the API) skips or names it instead of failing or hanging, the other runs are
    read, and a run into its folder is refused in one line and touches nothing."""
    from stabexp.api import load_run
    from stabexp.plotting.collect import collect
    from stabexp.status import run_state

    good, bad = tmp_path / "sweep" / "good", tmp_path / "sweep" / "bad"
    cfg = make_cfg("group=postln")
    trainer.train(cfg, good)
    trainer.train(cfg, bad)
    _spoil(bad / "summary.json", kind)
    metrics = (bad / "metrics.csv").read_bytes()
    runs = collect(tmp_path / "sweep")["runs"]
    assert runs.run.tolist() == ["good"]
    assert any("skipped" in r.message and str(bad) in r.message for r in caplog.records)
    state = run_state(bad)
    assert state["status"] == "unreadable" and "summary.json is not a run's" in state["note"]
    from stabexp.status import format_states
    assert "2 runs: 1 completed, 1 unreadable" in format_states(tmp_path / "sweep", [run_state(good), state])
    with pytest.raises((ValueError, FileNotFoundError), match="not a run"):
        load_run(bad)
    with pytest.raises(ConfigError, match="is not a run's summary") as refused:
        trainer.train(cfg, bad)
    assert "\n" not in str(refused.value)
    assert (bad / "metrics.csv").read_bytes() == metrics
    if kind in ("dir", "fifo"):  # not a file: never replaced, even with overwrite
        with pytest.raises(ConfigError, match="remove it"):
            trainer.train(make_cfg("group=postln", "overwrite=true"), bad)
    else:
        assert trainer.train(make_cfg("group=postln", "overwrite=true"), bad)["status"] == "completed"


def test_an_outputs_folder_under_a_folder_named_figures_keeps_its_runs(tmp_path):
    """find_runs leaves out the collected tables and figures made from the runs, by the names of
    the folders below the outputs folder only: above it, `figures` or `collected` hide nothing."""
    from stabexp.train.files import SUMMARY, find_runs

    outputs = tmp_path / "figures" / "collected" / "out"
    for run in ("multirun/a", "multirun/b", "figures/plot_run", "collected/table_run"):
        (outputs / run).mkdir(parents=True)
        (outputs / run / SUMMARY).write_text("{}")
    assert find_runs(outputs) == [outputs / "multirun" / "a", outputs / "multirun" / "b"]


def test_a_row_cut_short_is_left_out_with_a_warning_not_read_as_whole(tmp_path, caplog):
    """A metrics.csv that ends mid-row (a run killed in the middle of a write): the cut row is not
    read as a row (its loss "2" is the first digit of 2.9359), the whole rows before it are."""
    from stabexp import api
    from stabexp.train.files import read_run_table

    (tmp_path / "metrics.csv").write_text("step,lr,loss\n1,0.001,3.1\n2,0.001,3.0\n3,0.001,2")
    with caplog.at_level("WARNING", logger="stabexp"):
        frame = read_run_table(tmp_path / "metrics.csv")
    assert frame.step.tolist() == [1, 2] and frame.loss.tolist() == [3.1, 3.0]
    assert "metrics.csv: its last row is cut short (9 bytes with no line end): left out" in caplog.text
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert api._csv(tmp_path / "metrics.csv").step.tolist() == [1, 2]  # what load_run reads
    assert read_run_table(tmp_path / "absent.csv").empty


def test_a_read_only_folder_is_one_line_for_a_run_a_sweep_and_a_record(stabexp_main, tmp_path, monkeypatch):
    """A run or sweep folder that is there but cannot be written (a read-only mount; os.access
    says so, as it does for root too) is refused before Hydra writes into it; a file the claims
    command cannot write is one line naming it, exit 1: never a traceback."""
    import errno
    import os

    from conftest import TINY

    done = stabexp_main("run", *TINY, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if str(path).startswith(str(tmp_path / "ro"))
                        else real_access(path, mode, *a, **k))
    (tmp_path / "ro").mkdir()
    for args, what in (([f"hydra.run.dir={tmp_path / 'ro'}"], "run folder"),
                       (["-m", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'ro'}"], "sweep folder")):
        r = stabexp_main("run", *TINY, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"cannot write in the {what} {tmp_path / 'ro'}: it is read-only here" in r.stderr
    assert not any((tmp_path / "ro").iterdir())

    import stabexp.claims.measures as measures

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".ev.csv.part"))
    monkeypatch.setattr(measures, "write_atomic", read_only, raising=False)
    monkeypatch.setattr(measures, "write_recorded", read_only)
    r = stabexp_main("claims", str(tmp_path), "--record", str(tmp_path / "ev.csv"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot write {tmp_path / '.ev.csv.part'}: Read-only file system" in r.stderr
