"""The `stabexp` console script end to end, in a subprocess, as a researcher types it."""

import json

import pandas as pd
import pytest

from conftest import TINY, one_line_error


def test_run_writes_a_self_describing_folder(stabexp_cli):
    r = stabexp_cli("run", *TINY, "group=deepnorm")
    assert r.returncode == 0, r.stderr
    runs = list((stabexp_cli.outputs / "runs").iterdir())
    assert len(runs) == 1
    run = runs[0]
    assert "group=deepnorm" in run.name
    for name in ("config.yaml", "metrics.csv", "layers.csv", "summary.json", ".hydra/config.yaml"):
        assert (run / name).exists(), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["group"] == "deepnorm"
    assert set(summary["constants"]["deepnorm"]) == {"encoder", "decoder"}
    assert str(run) in r.stdout + r.stderr  # says where the results are


def test_multirun_puts_one_folder_per_job_under_one_sweep_folder(stabexp_cli):
    r = stabexp_cli("run", "-m", *TINY, "group=postln,admin")
    assert r.returncode == 0, r.stderr
    sweeps = list((stabexp_cli.outputs / "multirun").iterdir())
    assert len(sweeps) == 1 and "group=postln,admin" in sweeps[0].name
    jobs = sorted(p.name for p in sweeps[0].iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 2
    assert any("group=postln" in j for j in jobs) and any("group=admin" in j for j in jobs)
    for job in jobs:
        assert json.loads((sweeps[0] / job / "summary.json").read_text())["status"] == "completed"
    # Re-running the same sweep finds the same folders and leaves finished runs alone.
    before = {j: (sweeps[0] / j / "metrics.csv").read_bytes() for j in jobs}
    again = stabexp_cli("run", "-m", *TINY, "group=postln,admin")
    assert again.returncode == 0, again.stderr
    assert list((stabexp_cli.outputs / "multirun").iterdir()) == sweeps
    assert {j: (sweeps[0] / j / "metrics.csv").read_bytes() for j in jobs} == before


def test_forced_divergence_exits_zero_and_keeps_rows(stabexp_cli):
    r = stabexp_cli("run", *TINY, "group=postln", "train.lr=1000", "train.steps=50")
    assert r.returncode == 0, r.stderr
    run = next((stabexp_cli.outputs / "runs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_at_step"] >= 1
    assert pd.read_csv(run / "metrics.csv")["step"].iloc[-1] == summary["diverged_at_step"]


def test_sweep_goes_on_past_a_diverged_run(stabexp_cli):
    r = stabexp_cli("run", "-m", *TINY, "group=postln", "train.steps=50", "train.lr=1000,0.001")
    assert r.returncode == 0, r.stderr
    sweep = next((stabexp_cli.outputs / "multirun").iterdir())
    statuses = sorted(json.loads(p.read_text())["status"] for p in sweep.glob("*/summary.json"))
    assert statuses == ["completed", "diverged"]


@pytest.mark.parametrize("args, words", [
    (["group=nope"], ["group=nope", "postln_warmup", "deepnorm"]),
    (["hydra.run.dir=/proc/stabexp/run"], ["cannot create the run folder /proc/stabexp/run"]),
])
def test_bad_input_is_one_clear_line_from_the_console_script(stabexp_cli, args, words):
    # The process as a user starts it: nothing else reaches stderr (tests/test_bad_input.py
    # checks every kind of bad value through the same code, in-process).
    r = stabexp_cli("run", *args)
    assert r.returncode == 2
    one_line_error(r, *words)
    assert not stabexp_cli.outputs.exists() or not any(stabexp_cli.outputs.rglob("metrics.csv"))


def _job_groups_and_depths(outputs):
    sweep = next((outputs / "multirun").iterdir())
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert all(s["status"] == "completed" for s in summaries)
    return sorted((s["group"], s["depth"]) for s in summaries)


def _groups(include, exclude=()):
    """The groups of conf/group that Hydra's glob(include, exclude) picks: computed here, so that
    a new group needs no edit of this test."""
    from fnmatch import fnmatch

    from stabexp.paths import conf_dir

    names = [p.stem for p in (conf_dir() / "group").glob("*.yaml")]
    return sorted(n for n in names if any(fnmatch(n, i) for i in include)
                  and not any(fnmatch(n, e) for e in exclude))


@pytest.mark.parametrize("sweep, jobs", [
    (["group=glob(post*)"], [(g, 2) for g in _groups(["post*"])]),
    (["group=glob(admin*,exclude=[admin_*])"], [(g, 2) for g in _groups(["admin*"], ["admin_*"])]),
    (["group=glob([admin*,pre*],exclude=[admin_*])", "depth=range(1,3)"],
     [(g, d) for g in _groups(["admin*", "pre*"], ["admin_*"]) for d in (1, 2)]),
    (["group=choice(admin,deepnorm)"], [("admin", 2), ("deepnorm", 2)]),
    (["group='admin','preln'"], [("admin", 2), ("preln", 2)]),
])
def test_every_sweep_form_of_the_basic_sweeper_runs(stabexp_cli, sweep, jobs):
    assert jobs  # each pattern picks at least one group
    r = stabexp_cli("run", "-m", *TINY, "train.steps=1", "probe.enabled=false", *sweep)
    assert r.returncode == 0, r.stderr
    assert _job_groups_and_depths(stabexp_cli.outputs) == jobs


def test_bad_input_does_not_touch_a_finished_run(stabexp_cli):
    assert stabexp_cli("run", *TINY).returncode == 0
    run = next((stabexp_cli.outputs / "runs").iterdir())
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    r = stabexp_cli("run", *TINY, "train.lr=-1")
    assert r.returncode == 2
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_overwrite_reruns_the_same_folder(stabexp_cli):
    assert stabexp_cli("run", *TINY).returncode == 0
    run = next((stabexp_cli.outputs / "runs").iterdir())
    first = json.loads((run / "summary.json").read_text())["wall_seconds"]
    assert stabexp_cli("run", *TINY, "overwrite=true").returncode == 0
    assert list((stabexp_cli.outputs / "runs").iterdir()) == [run]
    assert json.loads((run / "summary.json").read_text())["wall_seconds"] != first


def test_cfg_job_prints_the_config_and_runs_nothing(stabexp_cli):
    r = stabexp_cli("run", "group=admin", "depth=7", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "residual: admin" in r.stdout and "depth: 7" in r.stdout
    assert not (stabexp_cli.outputs / "runs").exists() or not any((stabexp_cli.outputs / "runs").rglob("metrics.csv"))


def test_cfg_job_after_the_overrides_of_a_preset(stabexp_cli):
    r = stabexp_cli("run", "experiment=smd", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "experiment: smd" in r.stdout and not (stabexp_cli.outputs / "multirun").exists()


def test_help_and_list(stabexp_cli):
    r = stabexp_cli("run", "--help")
    assert r.returncode == 0 and "group" in r.stdout
    r = stabexp_cli("list")
    assert r.returncode == 0
    for group in _groups():  # every group file of conf/group has its line
        assert any(line.startswith(f"  {group} ") for line in r.stdout.splitlines()), group
    assert "arXiv 2203.00555" in r.stdout and "arXiv 2004.08249" in r.stdout and "arXiv 2502.02732" in r.stdout


def _groups():
    from stabexp.paths import conf_dir

    return [p.stem for p in (conf_dir() / "group").glob("*.yaml")]


def test_help_with_overrides(stabexp_cli):
    """--help shows the config the overrides compose (a sweep's keys left out, as Hydra's help
    is one run), and a bad override is the same one line as without --help."""
    r = stabexp_cli("run", "--help", "-m", "group=glob(post*)", "depth=7")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "depth: 7" in r.stdout and "Powered by Hydra" in r.stdout
    one_line_error(stabexp_cli("run", "--help", "group=nope"), "group=nope", "postln")
    one_line_error(stabexp_cli("run", "--help", "group=postln,preln"), "add -m")
    assert not (stabexp_cli.outputs / "multirun").exists() and not (stabexp_cli.outputs / "runs").exists()


@pytest.mark.parametrize("sweeper,per_job", [("checked", 1), ("basic", 2)])
def test_the_default_sweeper_leaves_each_job_to_the_launcher_to_compose(stabexp_main, monkeypatch, sweeper, per_job):
    """hydra/sweeper=checked (the default) composes no job's config itself: the launcher composes
    each once, where Hydra's basic sweeper composes each a second time before the first starts;
    both run the same jobs."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    composed = []
    load = ConfigLoaderImpl.load_sweep_config
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config",
                        lambda self, master_config, sweep_overrides: composed.append(sweep_overrides)
                        or load(self, master_config, sweep_overrides))
    r = stabexp_main("run", "-m", *TINY, "train.steps=1", "probe.enabled=false", "seed=0,1,2",
                     f"hydra/sweeper={sweeper}", "hydra/launcher=basic")
    assert r.returncode == 0, r.stderr
    assert sorted(next(o for o in job if o.startswith("seed=")) for job in composed) == \
        sorted(["seed=0", "seed=1", "seed=2"] * per_job)
    sweep = next((stabexp_main.outputs / "multirun").iterdir())
    assert len([p for p in sweep.iterdir() if (p / "summary.json").exists()]) == 3


def test_a_sweep_of_many_jobs_says_why_it_waits_before_the_first_starts(stabexp_main, monkeypatch):
    """The launcher composes every job's config before the first starts (a 1,000-seed sweep: minutes):
    from app.MANY_JOBS jobs on, one line says so first, with the count."""
    from stabexp import app

    monkeypatch.setattr(app, "MANY_JOBS", 3)
    r = stabexp_main("run", "-m", *TINY, "train.steps=1", "probe.enabled=false", "seed=range(0,3)",
                     "hydra/launcher=basic")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0].startswith("stabexp: 3 jobs: Hydra composes the config of each")
    r = stabexp_main("run", "-m", *TINY, "train.steps=1", "probe.enabled=false", "seed=range(0,2)",
                     "hydra/launcher=basic")
    assert r.returncode == 0 and "Hydra composes" not in r.stderr
