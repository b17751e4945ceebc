"""The README and docs/ as a user reads them: every `stabexp` command they show runs as written
(each `stabexp run` line passes the checks `stabexp run` makes before it starts, every value of
every sweep composed and validated; an error they show is the error the command prints, or how
it starts where the page cuts a list of names short with ", ..."), every
relative link and image resolves, and no page or source file names a file outside the repository.
"""

import re
import shlex
import sys
from pathlib import Path

import pytest

from stabexp import bench, listing
from stabexp.config import ConfigError
from stabexp.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# A block with `# my_conf/<path>.yaml` in its first lines is a file of the user's config folder.
USER_FILE = re.compile(r"^# (my_conf/\S+\.yaml)\b")


def _blocks(page: Path):
    return FENCE.findall(page.read_text())


def _lines(block: str):
    """The block's lines, with backslash continuations joined."""
    out, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            out.append(pending + line)
            pending = ""
    return out


def _commands():
    """(page, command, the error line the page shows it printing, or None)."""
    found = []
    for page in PAGES:
        for block in _blocks(page):
            lines = _lines(block)
            for i, line in enumerate(lines):
                shown = line.startswith("$ ")
                command = line[2:] if shown else line
                if not command.startswith("stabexp "):
                    continue
                error = lines[i + 1] if shown and i + 1 < len(lines) and lines[i + 1].startswith("stabexp: error:") else None
                found.append((page.relative_to(ROOT).as_posix(), command, error))
    return found


COMMANDS = _commands()


@pytest.fixture
def user_conf(tmp_path, monkeypatch):
    """The docs' own config files (blocks headed `# my_conf/...yaml`), in a working folder."""
    for page in PAGES:
        for block in _blocks(page):
            match = next(filter(None, map(USER_FILE.match, block.splitlines()[:3])), None)
            if match:
                target = tmp_path / match.group(1)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _args(command: str, cwd: Path):
    """The arguments the shell would pass (the variables the docs use expanded)."""
    expanded = command.replace("$PWD", str(cwd)).replace("$HOME", str(Path.home()))
    return shlex.split(expanded, comments=True)[1:]


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20
    assert {c.split()[1] for _, c, _ in COMMANDS} >= {"run", "list", "report", "status", "bench", "plan"}


@pytest.mark.parametrize("page, command, error", [c for c in COMMANDS if c[1].split()[1] == "run"],
                         ids=[f"{c[0]}: {c[1][:70]}" for c in COMMANDS if c[1].split()[1] == "run"])
def test_each_documented_run_passes_the_checks_or_gives_the_error_shown(page, command, error, user_conf):
    args = _args(command, user_conf)[1:]
    try:
        preflight(args, prepare_data=False)
    except ConfigError as raised:
        skip_without_its_extra(raised)
        if error is None:
            raise
        printed = f"stabexp: error: {raised}"
        # A page may cut a long list of names short ("choose one of admin, deepnorm, ..."), so
        # that a new group or key needs no edit of it: what it shows is how the line starts.
        if error.endswith(", ..."):
            assert printed.startswith(error[:-len("...")]), (printed, error)
        else:
            assert printed == error
    else:
        assert error is None, f"{command}: passed the checks, where the page shows {error}"


def skip_without_its_extra(error: ConfigError) -> None:
    """A documented command that needs an optional extra this environment lacks (a tracker's
    package, the submitit launcher) is skipped with the reason, not failed: `pip install -e
    ".[test]"` alone runs the suite."""
    import importlib.util

    text = str(error)
    if "which is not installed" in text:
        pytest.skip(text)
    if "hydra/launcher/submitit" in text and importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        pytest.skip("the submitit launcher is not installed: make install EXTRAS=launchers")


def test_documented_list_report_status_and_bench_lines_parse(user_conf, capsys):
    for page, command, _ in COMMANDS:
        args = _args(command, user_conf)
        if args[0] == "list":
            assert listing.main(args[1:]) == 0, (page, command)
        elif args[0] == "bench":
            bench.parse_args(args[1:])
        elif args[0] == "plan":  # its flags, and its overrides pass run's checks on its K ranks
            from stabexp.plan import _options

            opts = _options(args[1:])
            preflight(opts["overrides"], prepare_data=False, world=(opts["world"], True))
        elif args[0] in ("report", "status"):
            # A sweep folder of a preset, or none (the newest): at most one argument.
            assert len(args) <= 2 and not any(a.startswith("-") for a in args[1:]), (page, command)
        elif args[0] == "claims":
            from stabexp.claims.command import _parser

            _parser().parse_args(args[1:])
        elif args[0] == "export-tensorboard":  # SWEEP_DIR [--logdir DIR]
            rest = args[1:]
            if "--logdir" in rest:
                i = rest.index("--logdir")
                rest = rest[:i] + rest[i + 2:]
            assert len(rest) == 1 and not rest[0].startswith("-"), (page, command)
    assert "Control groups (group=NAME):" in capsys.readouterr().out


def test_help_and_cfg_job_are_shown_and_run(stabexp_main):
    # `--help` hands over to Hydra, which tests/test_cli.py runs in a subprocess; `--cfg job`
    # prints the composed config here.
    for line in ("stabexp run --help", "stabexp run group=admin depth=6 --cfg job"):
        assert any(c.split("#")[0].split() == line.split() for _, c, _ in COMMANDS), f"the docs no longer show `{line}`"
    printed = stabexp_main("run", "group=admin", "depth=6", "--cfg", "job")
    assert printed.returncode == 0 and "name: admin" in printed.stdout and "depth: 6" in printed.stdout
    assert not stabexp_main.outputs.exists()  # printing the config runs nothing


def _claims_tables():
    """scripts/claims_tables.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("claims_tables", ROOT / "scripts" / "claims_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_relative_link_and_image_resolves():
    anchor = _claims_tables().anchor  # GitHub's anchor of a heading
    anchors = {page: {anchor(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)} for page in PAGES}
    broken = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and resolved in anchors and anchor not in anchors[resolved]:
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_no_page_or_source_names_a_file_outside_the_repository():
    needles = ("REFERENCE" + ".md", "REFERENCE" + "_METHODS", "../" + "shared")
    places = [ROOT / "README.md", *[p for d in ("src", "conf", "docs", "scripts", "examples", "tests")
                                    for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md", ".yaml")]]
    hits = [f"{p.relative_to(ROOT)}: {n}" for p in places for n in needles if n in p.read_text()]
    assert not hits, hits


def test_the_readme_lists_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert not missing, missing


def test_the_python_examples_run_on_a_sweep_of_real_runs(make_cfg, tmp_path, monkeypatch, capsys):
    from stabexp.train.trainer import train

    sweep = tmp_path / "outputs" / "multirun" / "experiment=deepnet_early"
    for group in ("postln", "deepnorm"):
        train(make_cfg(f"group={group}", "experiment=deepnet_early", "train.steps=50", "probe.first_steps=10",
                       "probe.every=10", "hydra.mode=RUN"), sweep / f"group={group}")
    monkeypatch.chdir(tmp_path)
    examples = [b for page in (ROOT / "README.md", ROOT / "docs" / "api.md")
                for b in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)]
    assert len(examples) >= 2
    for code in examples:
        scope = {}
        exec(compile(code, "<docs>", "exec"), scope)
        out = capsys.readouterr().out
        # What an example prints is checked, not only that it runs: no table comes out empty.
        assert "Empty DataFrame" not in out and "Series([]" not in out, out
    assert "deepnorm" in out and "| group |" in out
    # api.md's gradient rows at step 1: every decoder layer of both groups' runs.
    step_1 = scope["step_1"]
    assert set(step_1["stack"]) == {"decoder"} and set(step_1["group"]) == {"postln", "deepnorm"}
    assert sorted(set(step_1["layer"])) == list(range(1, scope["sweep"].runs["depth"].iloc[0] + 1))
    # outputs.md's export example, on the run its commands make.
    from stabexp import export

    run = tmp_path / "outputs" / "runs" / "depth=6__group=admin__train.save_model=true"
    train(make_cfg("group=admin", "depth=6", "train.save_model=true"), run)
    assert export.main([str(run)]) == 0
    (code,) = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "outputs.md").read_text(), re.S | re.M)
    scope = {}
    exec(compile(code, "<docs>", "exec"), scope)
    assert scope["postln"].config.residual == "postln" and scope["admin"].config.residual == "admin"


def test_the_verdict_tables_are_what_stabexp_claims_computes():
    """The README's and results.md's verdict tables are `stabexp claims docs/data`'s output, to the
    character: `python scripts/claims_tables.py` rewrites them."""
    module = _claims_tables()
    judged = module.results()
    for page, table in module.tables(judged).items():
        text = page.read_text()
        assert text.count(module.BEGIN) == 1 and text.count(module.END) == 1, page
        shown = text.split(module.BEGIN, 1)[1].split(module.END, 1)[0].strip("\n")
        assert shown == table, f"{page.name}: run python scripts/claims_tables.py"
    results = module.RESULTS.read_text()
    # its judged lines and its table of the verdicts before and after the regime checks, too
    assert module.results_page(results, judged) == results, "results.md: run python scripts/claims_tables.py"
    sections = {c.section for c in module.claims.CLAIMS}
    assert results.count(module.JUDGED) == len(sections)  # a line per section that judges a claim


def _page_modules(page: Path) -> dict:
    """The page's Python blocks that start with `# NAME.py`: the modules it tells a user to write."""
    found = {}
    for code in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M):
        first = code.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            found[first[2:-3]] = code
    return found


def test_the_figures_table_of_presets_md_is_the_registry_s():
    """docs/presets.md's table of figures is FIGURES (stabexp/plotting/table.py) to the
    character: `python scripts/make_plots.py --markdown` prints it."""
    from stabexp.plotting.table import markdown

    page = (ROOT / "docs" / "presets.md").read_text()
    shown = page.split("<!-- figures: begin -->\n")[1].split("\n<!-- figures: end -->")[0]
    assert shown == markdown(ROOT / "docs" / "figures"), "docs/presets.md: paste python scripts/make_plots.py --markdown"


@pytest.mark.parametrize("overrides, check", [
    (["group=preln", "group.residual=mylab_norms.PeriLN"], lambda s: s["constants"]["residual"] == "mylab_norms.PeriLN"),
    (["group.init=mylab_init.small_embeddings"], lambda s: s["constants"]["small_embeddings"] == {"factor": 0.5}),
    (["task=reverse", "task.kind=mylab_tasks.CopyTask"], lambda s: "mylab_tasks" in sys.modules),
    (["optim.name=mylab_optim.nesterov"], lambda s: s["optim"]["name"] == "mylab_optim.nesterov"),
    (["train.hooks=[mylab_hooks.MaxNorm]"], lambda s: "mylab_hooks" in sys.modules),
], ids=["placement", "init", "task", "optimiser", "step_hook"])
def test_the_plugin_examples_run_as_written(stabexp_main, tmp_path, monkeypatch, overrides, check):
    """docs/plugins.md's modules, written out as the page shows them, each named on the command line
    of a short run that completes (the optimiser's with the default optim, which sets no momentum)."""
    import json

    from conftest import TINY

    modules = _page_modules(ROOT / "docs" / "plugins.md")
    assert set(modules) == {"mylab_norms", "mylab_init", "mylab_tasks", "mylab_optim", "mylab_probes", "mylab_hooks"}
    for name, code in modules.items():
        (tmp_path / f"{name}.py").write_text(code)
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported here by this run, or not at all
    monkeypatch.syspath_prepend(str(tmp_path))
    r = stabexp_main("run", *TINY, *overrides, "hydra.run.dir=" + str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and check(summary), summary


def test_the_probe_example_registered_by_its_entry_point_runs_and_resumes(stabexp_main, make_cfg, tmp_path,
                                                                         monkeypatch):
    """docs/plugins.md's probe, one file registered by the page's entry point: `probe.extra` names it,
    its file holds a row per probe step after the first, each the cosine of the two gradients,
    and a run stopped after a checkpoint and resumed writes the same rows."""
    import pandas as pd

    from stabexp import plugins
    from stabexp.train import trainer

    from conftest import TINY

    site = tmp_path / "site"
    site.mkdir()
    (site / "mylab_probes.py").write_text(_page_modules(ROOT / "docs" / "plugins.md")["mylab_probes"])
    toml = re.search(r'\[project\.entry-points\."stabexp\.probes"\]\n(\w+) = "([\w.:]+)"',
                     (ROOT / "docs" / "plugins.md").read_text())
    info = site / "mylab-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[stabexp.probes]\n{toml.group(1)} = {toml.group(2)}\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "mylab_probes", raising=False)
    plugins.clear()  # the registries read the entry points again, this package's among them
    try:
        overrides = ["train.steps=12", "probe.every=2", "train.eval_every=4", "train.checkpoint_every=4",
                     "probe.extra=[grad_alignment]"]
        r = stabexp_main("run", *TINY, *overrides, "hydra.run.dir=" + str(tmp_path / "whole"))
        assert r.returncode == 0, r.stderr
        rows = pd.read_csv(tmp_path / "whole" / "grad_alignment.csv")
        assert rows.step.tolist() == [2, 4, 6, 8, 10, 12]  # the probe steps 1, 2, 4, ...: from the second on
        assert rows.grad_alignment.between(-1, 1).all() and rows.grad_alignment.nunique() == 6
        from stabexp import api

        pd.testing.assert_frame_equal(api.load_run(tmp_path / "whole").table("grad_alignment"), rows)

        real = trainer.Run.step

        def stop_at_seven(run, step):
            if step == 7:
                raise KeyboardInterrupt
            return real(run, step)
        monkeypatch.setattr(trainer.Run, "step", stop_at_seven)
        cfg = make_cfg(*overrides)
        with pytest.raises(KeyboardInterrupt):
            trainer.train(cfg, tmp_path / "resumed")
        monkeypatch.setattr(trainer.Run, "step", real)
        assert trainer.train(cfg, tmp_path / "resumed")["resumed_from"] == [4]
        resumed = pd.read_csv(tmp_path / "resumed" / "grad_alignment.csv")
        pd.testing.assert_frame_equal(resumed, rows, check_exact=True)
    finally:
        monkeypatch.undo()
        plugins.clear()


def test_the_monitor_example_runs_as_written_and_report_reads_its_folder(tmp_path, monkeypatch, capsys):
    """docs/probes.md's plain loop, run as the page shows it (`python monitor_gpt2.py`), then
    `stabexp report outputs/monitor` on what it wrote."""
    import runpy

    import pandas as pd

    from stabexp.report import main as report

    pytest.importorskip("transformers", reason="the monitor extra: make install EXTRAS=monitor")
    code = _page_modules(ROOT / "docs" / "probes.md")["monitor_gpt2"]
    (tmp_path / "monitor_gpt2.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "monitor_gpt2.py"), run_name="__main__")
    folder = tmp_path / "outputs" / "monitor" / "gpt2_4L"
    metrics = pd.read_csv(folder / "metrics.csv")
    assert metrics.step.tolist() == list(range(21)) + [30, 40, 50] and metrics.model_update.loc[1:].gt(0).all()
    assert report(["outputs/monitor"]) == 0
    assert "| gpt2 |" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name, group", [("monitor_trainer", "gpt2_trainer"), ("monitor_lightning", "gpt2_lightning")])
def test_the_callback_examples_run_as_written(name, group, tmp_path, monkeypatch, capsys):
    """docs/probes.md's Trainer and Lightning examples, each run as the page shows it (`python
    NAME.py`): 20 steps probed where the defaults say, and `stabexp report` tables the folder."""
    import runpy

    import pandas as pd

    from stabexp.report import main as report

    pytest.importorskip("transformers", reason="the monitor extra: make install EXTRAS=monitor")
    if name == "monitor_lightning":
        pytest.importorskip("lightning", reason="the monitor extra: make install EXTRAS=monitor")
    (tmp_path / f"{name}.py").write_text(_page_modules(ROOT / "docs" / "probes.md")[name])
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / f"{name}.py"), run_name="__main__")
    metrics = pd.read_csv(tmp_path / "outputs" / "monitor" / group / "metrics.csv")
    assert metrics.step.tolist() == list(range(21)) and metrics.model_update.loc[1:].gt(0).all()
    assert metrics.grad_norm.loc[1:].gt(0).all()
    capsys.readouterr()
    assert report(["outputs/monitor"]) == 0
    assert f"| {group} |" in capsys.readouterr().out


def test_each_preset_cost_is_written_once():
    """A preset's cost is its file's `# cost:` line: `stabexp list` prints it, presets.md's table
    shows the same text, and the README and the Makefile give make reproduce as their sum."""
    from stabexp.presets import cost, reproduce_presets, total

    presets = {p.stem: p for p in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))}
    table = {}
    for line in (ROOT / "docs" / "presets.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 4 and cells[0].strip("`") in presets:
            table[cells[0].strip("`")] = cells[3]
    assert set(table) == set(presets)
    for name, path in presets.items():
        assert cost(path) is not None, f"{path.name} has no # cost: line"
        assert table[name] == cost(path).text, name
    names = reproduce_presets(ROOT / "Makefile")
    assert sorted(names) == sorted(presets)
    summed = total([presets[n] for n in names])
    hours = re.match(r"about (\d+ h)", summed.text).group(1)
    for page in (ROOT / "README.md", ROOT / "Makefile", ROOT / "docs" / "presets.md"):
        text = page.read_text().replace("**", "")
        said = re.findall(r"about (\d+ h)(?: \d+ min)? on (?:this project's )?2[- ]", text)
        assert said == [hours], (page.name, said, summed.text)


def test_make_bench_runs_the_benchmark_commands_the_docs_time():
    """`make bench` is the commands whose times docs/benchmarks.md writes beside them (one source
    for its cost)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nbench: install\n", 1)[1].split("\n\n", 1)[0]
    commands = [line.strip().replace("$(BIN)/", "") for line in recipe.splitlines() if line.strip()]
    shown = {c.split("#")[0].strip() for _, c, _ in COMMANDS}
    assert commands and all(c in shown for c in commands), commands


def test_each_model_family_of_probes_md_names_a_test_that_exists():
    """The table of model families in docs/probes.md: each test it names is a test of
    tests/test_monitor.py, with the parameter id it gives."""
    text = (ROOT / "docs" / "probes.md").read_text()
    section = text[text.index("### The model families checked"):]
    section = section[:section.index("\n\n", section.index("| family |"))]
    named = re.findall(r"`(test_\w+)(?:\[([\w-]+)\])?`", section)
    source = (ROOT / "tests" / "test_monitor.py").read_text()
    assert len(named) >= 10
    for name, param in named:
        assert f"def {name}(" in source, name
        if param:  # among the ids of that test's own parametrize decorator
            at = source.index(f"def {name}(")
            decorators = source[source.rindex("\n\n\n", 0, at):at]
            assert f'"{param}"' in decorators, (name, param)
