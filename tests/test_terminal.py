"""What a user sees at the terminal: a pipe whose reader stops early, --version, shell
completion, `list --help`, a run's and the benchmark's progress, and what `stabexp status` says
of a sweep that is still running."""

import json
import logging
import re
import shlex
import subprocess
import sys

import pytest

from conftest import TINY, cli_command, cli_env, one_line_error

from stabexp.cli import COMMANDS


def _into(reader: str, outputs, *args):
    """`stabexp ARGS | READER` under `set -o pipefail`: the exit code is stabexp's."""
    line = " ".join(shlex.quote(a) for a in cli_command(*args)) + f" | {reader}"
    return subprocess.run(["bash", "-c", f"set -o pipefail; {line}"], capture_output=True, text=True,
                          env=cli_env(outputs), timeout=300)


@pytest.mark.slow  # the console script in a subprocess, as test_cli.py's
@pytest.mark.parametrize("args", [["list"], ["list", "--help"]], ids=["list", "list-help"])
def test_a_reader_that_has_gone_ends_the_output_not_the_command(tmp_path, args):
    # `true` leaves before stabexp writes its first line: every write meets a closed pipe.
    r = _into("true", tmp_path / "outputs", *args)
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.slow  # the console script in a subprocess, as test_cli.py's
def test_a_run_piped_into_a_reader_that_has_gone_still_runs_to_its_end(tmp_path):
    r = _into("true", tmp_path / "outputs", "run", *TINY, "hydra.run.dir=" + str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Logging error" not in r.stderr, r.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
    assert "completed after 6 steps" in (tmp_path / "run" / "stabexp.log").read_text()  # its log file has it all


@pytest.mark.slow  # the console script in a subprocess, as test_cli.py's
def test_head_takes_the_first_lines(tmp_path):
    r = _into("head -2", tmp_path / "outputs", "list")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert r.stdout.splitlines()[0] == "Control groups (group=NAME):" and len(r.stdout.splitlines()) == 2


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(stabexp_main, flag):
    import torch

    import stabexp

    r = stabexp_main(flag)
    assert r.returncode == 0
    line = r.stdout.strip()
    assert line.startswith(f"stabexp {stabexp.__version__}") and f"torch {torch.__version__}" in line, line
    assert "\n" not in line


def test_list_help_is_its_usage(stabexp_main):
    r = stabexp_main("list", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: stabexp list") and "Control groups" not in r.stdout


def test_list_gives_each_preset_its_cost(stabexp_main):
    from stabexp.paths import conf_dir
    from stabexp.presets import cost

    out = stabexp_main("list").stdout
    for path in (conf_dir() / "experiment").glob("*.yaml"):
        assert f"cost: {cost(path).text}" in out, path.stem


def test_the_usage_and_an_unknown_command_name_every_command(stabexp_main):
    usage = stabexp_main("--help").stdout
    for name, (args, what, _) in COMMANDS.items():
        assert f"stabexp {name} {args}" in usage and what in usage, name
    one_line_error(stabexp_main("nope"), "'nope'", *COMMANDS)


def test_shell_completion_is_installed_and_answers(stabexp_main, monkeypatch):
    script = stabexp_main("run", "-sc", "install=bash")
    assert script.returncode == 0 and "hydra_bash_completion" in script.stdout
    assert script.stdout.rstrip().endswith("stabexp")  # `complete ... stabexp`: the command it completes

    def answers(line):
        # What the installed script does on <TAB>: `stabexp -sc query=bash` with the line so far.
        monkeypatch.setenv("COMP_LINE", line)
        r = stabexp_main("-sc", "query=bash")
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert answers("stabexp r") == ["run", "report"]
    assert answers("stabexp ") == list(COMMANDS)  # every command of the table, plan among them
    assert answers("stabexp run group=postln_w") == ["group=postln_warmup"]
    assert "train.lr=" in answers("stabexp run depth=6 train.l")
    assert answers("stabexp list --con") == []  # only run's overrides are Hydra's to complete


def test_a_run_shows_progress_from_its_first_step(make_cfg, monkeypatch, caplog):
    """Not on a terminal: a line at the first step, then every probe.log_every steps and at least
    every LINE_SECONDS, each with the pace and the time left."""
    from stabexp.train import recording

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    clock = iter(range(0, 10_000, 2))  # each reading of the clock 2 s after the last
    monkeypatch.setattr(recording.time, "perf_counter", lambda: next(clock))
    progress = recording.Progress(make_cfg("group=postln", "train.steps=100", "probe.log_every=50"))
    with caplog.at_level(logging.INFO, logger="stabexp"):
        progress.update(1, 3.0, 0.5)
        progress.update(2, None, None)   # a step whose loss is not read (GPU), on no schedule
        monkeypatch.setattr(recording.Progress, "LINE_SECONDS", 1.0)
        progress.update(3, None, None)   # ... but LINE_SECONDS have passed
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("postln L2 step 1/100 loss 3.0000 model_update 0.5") and "left" not in lines[0]
    # The clock read at the first step's end (0 s) and at step 3 (6 s): 2 steps in 6 s, 97 to go.
    assert lines[1] == "postln L2 step 3/100 model_update 0.5, 0.333 steps/s, 4 min 51 s left", lines
    assert len(lines) == 2


def test_a_run_on_a_terminal_has_a_bar_with_its_pace(make_cfg, monkeypatch, capsys):
    from stabexp.train import recording

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    progress = recording.Progress(make_cfg("group=postln", "train.steps=10"))
    for step in range(4, 7):  # a run resumed at step 4: the bar starts there
        progress.update(step, 2.5, 0.25)
    progress.close()
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()[-1]
    assert "6/10" in bar and re.search(r"\d step/s|\dstep/s", bar) and "loss=2.500" in bar, bar


def test_the_benchmark_says_how_far_it_is(tmp_path, capsys):
    from stabexp.bench import main

    assert main(["--sizes", "tiny", "--depths", "1", "--repeats", "2", "--steps", "1", "--batch-size", "4",
                 "--no-memory", "--variants", "b:postln", "--out", str(tmp_path / "bench.json")]) == 0
    err = capsys.readouterr().err
    assert "# tiny 1L-1L: 0/3" in err  # before the variant is built: its warm-up and 2 windows to come


def test_long_work_off_a_terminal_says_how_far_it_is(monkeypatch, capsys):
    from stabexp.terminal import Counter

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    counter = Counter(4, "tiny 6L-6L", seconds=0)
    for _ in range(4):
        counter.update()
    counter.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "# tiny 6L-6L: 0/4" and len(lines) == 4  # and no line once all is done
    assert all(re.fullmatch(r"# tiny 6L-6L: [123]/4, about \d+ s left", line) for line in lines[1:]), lines


def test_status_of_a_sweep_still_running_does_not_ask_for_the_command_again(tmp_path):
    from stabexp.status import format_states

    def state(run, status):
        return {"run": run, "status": status, "last_step": None, "steps": None, "resumes_at": "-", "threads": None, "note": ""}

    running = format_states(tmp_path, [state("a", "completed"), state("b", "running"), state("c", "not started")])
    assert "Run the same command again" not in running and "still running" in running
    stopped = format_states(tmp_path, [state("a", "completed"), state("b", "interrupted")])
    assert "Run the same command again" in stopped


def test_hydras_flags_in_any_order_and_one_whose_value_is_optional(stabexp_main):
    """Hydra's own parser reads the command: `--info` with no value after it, flags before or
    after the overrides."""
    r = stabexp_main("run", "--info")
    assert r.returncode in (0, None) and "Config search path" in r.stdout, r.stderr
    r = stabexp_main("run", "--cfg", "job", "group=admin", "depth=3", "-p", "group")
    assert r.returncode in (0, None) and "name: admin" in r.stdout and "depth" not in r.stdout, r.stderr
    r = stabexp_main("run", "depth=3", "--cfg", "job", "group=admin")
    assert r.returncode in (0, None) and "depth: 3" in r.stdout and "residual: admin" in r.stdout, r.stderr
