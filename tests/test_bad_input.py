"""Bad values on the command line: each is one line naming the value and what is allowed, exit
code 2, and nothing written. Through `stabexp.cli.main` in-process, the code the console script
runs (tests/test_cli.py starts the script itself for two of them)."""

import pytest

from conftest import one_line_error


@pytest.mark.parametrize("args, words", [
    (["group=nope"], ["group=nope", "postln_warmup", "deepnorm"]),
    (["depth=0"], ["depth=0", ">= 1"]),
    (["train.lr=-0.1"], ["train.lr=-0.1", "> 0"]),
    (["train.lr=inf"], ["train.lr=inf", "finite"]),
    (["-m", "optim.weight_decay=0.1,nan"], ["optim.weight_decay=nan", "finite"]),
    (["hydra.run.dir=/proc/stabexp/run"], ["cannot create the run folder /proc/stabexp/run"]),
    (["task=lm", "task.path=~/wikitext"], ["task.path=~/wikitext", "$HOME"]),
    (["-m", "group=postln,preln", "hydra.sweep.dir=/proc/stabexp/sweep"], ["cannot create the sweep folder /proc/stabexp/sweep"]),
    (["depth=abc"], ["depth=abc"]),
    (["dpeth=3"], ["dpeth", "depth"]),
    (["train.stepz=3"], ["train.stepz", "steps"]),
    (["model=huge"], ["model=huge", "tiny", "base"]),
    (["-m", "depth=6,0"], ["depth=0"]),
    (["-m", "group=postln,nope"], ["group=nope", "admin"]),
    (["-m", "depth=6,x"], ["depth=x"]),
    (["depth=6,18"], ["depth=6,18", "-m"]),
    (["-m", "seed=range(0,3)", "seed=4,5"], ["seed is given twice", "seed=range(0,3)", "seed=4,5"]),
    (["-m", "group=admin,deepnorm", "depth=6", "group=preln"], ["group is given twice", "group=admin,deepnorm", "group=preln"]),
    (["optim=sgdm", "optim.momentum=1.5"], ["optim.momentum=1.5", "[0, 1)"]),
    (["optim=lamb"], ["optim=lamb", "adamw", "sgdm"]),
    (["model=normmlp"], ["task=sort", "normmlp", "teacher"]),
    (["train.schedule=cosine"], ["train.schedule=cosine", "warmup_inverse_sqrt"]),
    (["train.update_freq=0"], ["train.update_freq=0", ">= 1"]),
    (["experiment=nope"], ["experiment=nope", "deepnet_depth", "smd"]),
    (["scale=huge"], ["scale=huge", "quick"]),
    (["experiment=depth_table", "depth=0"], ["depth=0", ">= 1"]),
    (["model=normmlp", "task=teacher", "probe.at_init=true"], ["probe.at_init=True", "normmlp has none"]),
    (["train.warmup_init_lr=1e-7", "train.warmup_steps=0"], ["train.warmup_steps=0", "warmup_init_lr"]),
    (["group.decoder_residual=prenl"], ["group.decoder_residual=prenl", "preln"]),
    (["group=hybrid_postln_preln", "model.arch=decoder_only", "task=lm"],
     ["group.decoder_residual=preln", "model.arch=transformer"]),
    (["group=admin", "group.decoder_residual=preln"], ["group.init=admin_profiled", "every stack"]),
    (["group=dlcl", "probe.dependency=true"], ["probe.dependency=True", "dlcl"]),
    (["group=mix_ln"], ["group.residual=mix_ln", "decoder_only", "group=mix_ln"]),
    (["task=lm", "group=mix_ln", "group.mix_ratio=1.5"], ["group.mix_ratio=1.5", "[0, 1]"]),
    (["group=postln", "model.norm=dyt", "probe.dependency=true"], ["probe.dependency=True", "dyt"]),
    (["task=lm", "model.qk_norm=true", "train.qk_clip_tau=100"], ["train.qk_clip_tau=100", "qk_norm"]),
    (["task=lm", "optim=muon", "probe.weights=true"], ["probe.weights=True", "muon"]),
    (["task=multi30k", "train.qk_clip_tau=100"], ["train.qk_clip_tau=100", "padded"]),
    (["group=rezero", "group.norm=dyt"], ["group.norm=dyt", "rezero"]),
    (["probe.extra=[nope]"], ["probe.extra=nope", "no package registers a probe", "module.Class"]),
    (["probe.extra=[collections.OrderedDict]"], ["probe.extra=collections.OrderedDict", "not a subclass", "Probe"]),
    (["probe.extra=[stabexp.probes.weights.Weights]"], ["probe.extra=stabexp.probes.weights.Weights",
                                                        "probe.weights=true"]),
    (["group=preln", "probe.update_bound=true"], ["probe.update_bound=True", "postln or deepnorm"]),
    (["--bogus", "depth=2"], ["unrecognized arguments: --bogus", "--help"]),  # read by Hydra's own parser
    (["--cfg", "jobs"], ["--cfg", "'jobs'", "job"]),
    (["~depth"], ["~depth deletes depth", "depth=VALUE"]),
    (["~seed"], ["~seed deletes seed", "seed=VALUE"]),
    (["hydra.sweeper.params={depth:2}"], ["hydra.sweeper.params={depth:2}", "-m KEY=A,B"]),
    # What Hydra's lexer cannot read: the override named, and how to quote it.
    (["-m", "group=postln,", "depth=2"], ["cannot parse the override 'group=postln,'", "ends where a value",
                                          "quotes"]),
    (["group=a=b"], ["cannot parse the override 'group=a=b'", "stops at '='", "quotes"]),
])
def test_bad_input_is_one_clear_line(stabexp_main, args, words):
    r = stabexp_main("run", *args)
    assert r.returncode == 2
    one_line_error(r, *words)
    assert not stabexp_main.outputs.exists() or not any(stabexp_main.outputs.rglob("metrics.csv"))


@pytest.mark.parametrize("args, words", [
    (["depth=glob(*)"], ["depth=glob(*)", "not one", "range()"]),
    (["group=glob(nothing*)"], ["matches no group", "postln_warmup"]),
    (["group=glob(*,exclude=[*])"], ["matches no group"]),
    (["train.lr=interval(1e-4,1e-2)"], ["interval", "basic sweeper", "optuna"]),
    (["depth=range(0,2)"], ["depth=0", ">= 1"]),
    (["group=choice(postln,nope)"], ["group=nope", "admin"]),
    (["group=glob(*admin*)", "depth=choice(2,-1)"], ["depth=-1", ">= 1"]),
    (["group=glob(*)", "--cfg", "job"], ["--cfg", "-m"]),
    (["depth=range(2,2)"], ["depth=range(2,2) sweeps no value", "a < b"]),
    (["depth=range(5,2)"], ["depth=range(5,2) sweeps no value", "a < b"]),
    (["depth=range(2,4,-1)"], ["depth=range(2,4,-1) sweeps no value"]),
    (["depth=range(2,4,0)"], ["depth=range(2,4,0)", "must not be zero"]),
    (['hydra.sweeper.params={depth: "2,3"}'], ["hydra.sweeper.params", "-m KEY=A,B"]),
])
def test_a_sweep_form_with_a_bad_value_is_one_line(stabexp_main, args, words):
    r = stabexp_main("run", "-m", *args)
    one_line_error(r, *words)
    assert r.returncode == 2 and not stabexp_main.outputs.exists()


def test_status_of_a_folder_with_no_runs_is_one_line_as_report_s(stabexp_main, tmp_path):
    (tmp_path / "empty").mkdir()
    for command in ("status", "report"):
        r = stabexp_main(command, str(tmp_path / "empty"))
        assert r.returncode == 2, command
        one_line_error(r, "no run folders", str(tmp_path / "empty"))


@pytest.mark.parametrize("text", ["hydra: {overrides: {task: [cut", 'hydra:\n  overrides:\n    task: "seed=0,1"\n'])
def test_a_corrupt_multirun_yaml_invents_no_job(stabexp_main, tmp_path, text):
    """status over a sweep whose multirun.yaml is not Hydra's record (YAML cut short; a task that
    is a string, whose characters would read as overrides): the jobs whose folders exist, a note
    naming the file, and no job made up."""
    from conftest import TINY

    sweep = tmp_path / "sweep"
    r = stabexp_main("run", "-m", *TINY, "seed=0,1", f"hydra.sweep.dir={sweep}", "hydra/launcher=basic")
    assert r.returncode == 0, r.stderr
    (sweep / "multirun.yaml").write_text(text)
    r = stabexp_main("status", str(sweep))
    assert r.returncode == 0
    assert "multirun.yaml is not a sweep's record" in r.stderr
    assert "2 runs: 2 completed" in r.stdout
