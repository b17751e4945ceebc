"""Command line: `stabexp run [hydra args]`, `stabexp list`.

`stabexp run` is a plain Hydra app (overrides, -m, --cfg job, --help, hydra/launcher=...).
Before handing over to Hydra it checks the command line (stabexp.preflight), so a user error
is one line naming the bad value, never a traceback.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import List, Optional

import yaml

from stabexp import unfinished
from stabexp.config import ConfigError, conf_dir, outputs_dir, run_name
from stabexp.preflight import config_files, flags_first, make_folder, preflight, sweeps, user_config_dirs

log = logging.getLogger("stabexp")

USAGE = """usage: stabexp run [OVERRIDES] [-m] [--cfg job] [--help]   train one run, or a sweep with -m
       stabexp list [--config-dir DIR]                     the control groups and experiment presets, with their cost
       stabexp status [SWEEP_DIR]                          every run of a sweep: completed, running, ...
       stabexp report [SWEEP_DIR]                          a sweep as a markdown table (group x depth)
       stabexp claims [PATH ...] [--json] [--record FILE]  every paper claim's verdict, computed from the runs
       stabexp plan [OVERRIDES] [--world K] [--gpu-memory GB]  what one run needs per rank on K GPUs (nothing trained)
       stabexp bench [--sizes tiny,small] [--depths 6,18,50]  speed and memory against torch.nn.Transformer
       stabexp export RUN_FOLDER [OUT_FILE]                an Admin run's final weights as a Post-LN model
       stabexp export-tensorboard SWEEP_DIR [--logdir DIR] finished run folders as TensorBoard event files
       stabexp --version                                   stabexp's version, torch's and Python's
Shell completion of run's overrides (bash; zsh through bashcompinit):
  eval "$(stabexp run -sc install=bash)"
Examples:
  stabexp run group=postln depth=18
  stabexp run -m group=postln,postln_warmup depth=6,18
  stabexp run experiment=deepnet_depth scale=quick
Run folders go under {outputs}"""

# Hydra's own record of the command (.hydra/) is turned off and written by the task once the
# folder is known to be its run's (stabexp.train.folder.write_hydra_record); a command that
# names another hydra.output_subdir keeps Hydra's own.
RECORD_HYDRA = "hydra.output_subdir=null"


def _job_ended(out_dir: Path, why: str, hydra_cfg, err: Optional[BaseException] = None) -> None:
    """A sweep's job that did not finish: one line now, a line in the sum at the end (the packed
    launcher carries it back from the job's process), and on Hydra's launchers that run jobs in
    other processes (joblib, submitit) the error raised for it to report, which it does once
    every job has run."""
    log.error("job %s %s", out_dir.name, why, exc_info=err)  # the traceback: terminal and the job's log
    unfinished.JOBS.append((out_dir, why))
    if not any(name in str(hydra_cfg.launcher.get("_target_", "")) for name in ("BasicLauncher", "PackedLauncher")):
        raise RuntimeError(f"{out_dir}: {why}") from err


def task(cfg) -> None:
    """Hydra's task function: one job (of a sweep) or one run, in this process or in a packed
    sweep's job process (stabexp.sweep), which is why it lives at module level (picklable)."""
    from hydra.core.hydra_config import HydraConfig

    from stabexp.train.trainer import check, finished, train

    from stabexp.train.files import RunLocked
    from stabexp.train.stop import RunStopped

    from stabexp import distributed
    from stabexp.train import folder

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    if distributed.launched():
        distributed.setup()  # the K tasks of a submitit job enter here, not through cmd_run
        out_dir = distributed.broadcast(out_dir)  # one folder for all ranks: rank 0's
        if not distributed.is_rank0():
            logging.getLogger("stabexp").setLevel(logging.WARNING)
            # Under submitit every task has Hydra's log file open: rank 0's alone writes it.
            for handler in [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]:
                logging.getLogger().removeHandler(handler)
                handler.close()
    say = print if distributed.is_rank0() else (lambda *a, **k: None)  # one line, from rank 0
    hydra_cfg = HydraConfig.get()
    in_sweep = str(hydra_cfg.mode) in ("MULTIRUN", "RunMode.MULTIRUN")
    try:
        check(cfg)
        # Before Hydra's record of this command goes in; rank 0 reads the folder for all.
        refused = distributed.broadcast(folder.refused(out_dir, cfg) if distributed.is_rank0() else None)
        if refused:
            raise ConfigError(refused)
        if distributed.is_rank0() and hydra_cfg.output_subdir is None and not finished(out_dir, cfg):
            folder.write_hydra_record(out_dir, cfg)
        summary = train(cfg, out_dir)
    except ConfigError as err:
        if in_sweep:  # one job refused: said, and the sweep goes on (cmd_run sums up at the end)
            _job_ended(out_dir, f"refused: {err}", hydra_cfg)
            return
        say(f"stabexp: error: {err}", file=sys.stderr)
        sys.exit(2)
    except RunLocked as err:
        if in_sweep:
            # Another process runs this job (two launches of one sweep share the work).
            log.warning("skipped: %s", err)
            return
        say(f"stabexp: error: {err}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as stop:
        say(f"stabexp: stopped by {stop}: {out_dir} has a checkpoint; the same command resumes it",
            file=sys.stderr)
        sys.exit(128 + stop.signum)
    except Exception as err:
        if not in_sweep or distributed.world() > 1:  # K processes stop together (torchrun ends them)
            raise
        _job_ended(out_dir, f"failed: {type(err).__name__}: {err}", hydra_cfg, err)
        return
    eval_loss, bleu = summary.get("final_eval_loss"), summary.get("test_bleu")
    log.info("%s: %s after %s steps, eval loss %s%s, results in %s", summary["group"],
             summary["status"], summary.get("steps_done"),
             f"{eval_loss:.4f}" if eval_loss is not None else "n/a",
             f", test BLEU {bleu:.2f}" if bleu is not None else "", out_dir)


def _hydra_main():
    import hydra
    from hydra.core.plugins import Plugins

    from hydra_plugins.stabexp_launcher.packed_launcher import PackedLauncher

    # Hydra finds launchers by scanning the hydra_plugins folders, which misses an editable
    # install's (a path hook, not a folder): registered by hand, as Hydra's API allows.
    Plugins.instance().register(PackedLauncher)
    return hydra.main(version_base=None, config_path=str(conf_dir()), config_name="config")(task)


def cmd_run(args: List[str]) -> int:
    from stabexp import distributed

    if not distributed.launched():
        return _cmd_run(args)
    # torchrun, srun or submitit started K of us: one run on K processes (docs/scale.md). Every
    # rank checks the command and fetches the data it lacks before the process group forms (a
    # download or a tokenizer can take longer than a collective waits; each of their files is
    # written atomically, so ranks doing it at once are safe); the launcher's rank 0 prints.
    try:
        checked = preflight(args)
        if any("${now:" in h for h in checked.hydra_overrides):
            raise ConfigError("a run folder named by ${now:...} would differ between the processes of one "
                              "run: give hydra.run.dir (or hydra.sweep.dir) a fixed path")
    except ConfigError as err:
        if distributed.launcher_rank() == 0:
            print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    distributed.setup()
    try:
        return _cmd_run(args, checked)
    finally:
        distributed.teardown()


def _cmd_run(args: List[str], checked=None) -> int:
    from stabexp import distributed
    from stabexp.train.files import locked_message

    try:
        ours, hydra_overrides, multirun, wants_help, _, run_dir = checked or preflight(args)
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    if wants_help:
        # Hydra composes its help as one run, where a sweep is an error: show the config
        # without the swept keys.
        args = [a for a in args if a not in sweeps(ours)]
        multirun = False
    extra = []
    if multirun and not any(h.startswith("hydra.sweep.dir=") for h in hydra_overrides):
        # One sweep folder named from the whole sweep, so re-running it finds its jobs again.
        sweep_dir = outputs_dir() / "multirun" / run_name(ours)
        extra.append(f"hydra.sweep.dir='{sweep_dir}'")
    if not (wants_help or {"--cfg", "-c"} & set(args)):
        key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
        given = [h[len(key):].strip("'\"") for h in hydra_overrides if h.startswith(key)]
        if given and not given[0].strip():  # Hydra would write the run into the current folder
            print(f"stabexp: error: {key} is empty: give the {'sweep' if multirun else 'run'} folder's path "
                  "(or leave it out for one under the outputs folder)", file=sys.stderr)
            return 2
        folder = Path(given[0]) if given else sweep_dir if multirun else run_dir
        error = None
        if "${" not in str(folder) and distributed.is_rank0():  # an interpolation only Hydra resolves
            try:
                make_folder(folder, "sweep folder" if multirun else "run folder")
            except ConfigError as err:
                error = str(err)
            # A run folder another process holds: one line before Hydra writes into it (a sweep
            # skips such a job instead, in the task function).
            error = error or (None if multirun else locked_message(folder))
        error = distributed.broadcast(error)
        if error is not None:
            if distributed.is_rank0():
                print(f"stabexp: error: {error}", file=sys.stderr)
            return 2
    if not any(h.lstrip("+").startswith("hydra.output_subdir=") for h in hydra_overrides):
        extra.append(RECORD_HYDRA)
    if multirun and distributed.launched() and not any(h.startswith(("hydra/launcher=", "hydra.launcher."))
                                                      for h in hydra_overrides):
        # K processes run one run at a time together: the sweep goes one job after another.
        extra.append("hydra/launcher=basic")
    if not distributed.is_rank0():
        # Hydra's own files (.hydra/, the log file, a sweep's multirun.yaml) come from rank 0:
        # the other ranks log to the terminal and keep a sweep's bookkeeping in a temp folder.
        extra += ["hydra/job_logging=stdout"]
        if multirun:
            import tempfile

            extra = [e for e in extra if not e.startswith("hydra.sweep.dir=")]
            args = [a for a in args if not a.startswith("hydra.sweep.dir=")]
            extra.append(f"hydra.sweep.dir='{tempfile.mkdtemp(prefix='stabexp-rank')}'")
    # Flags first, then every override in one run: Hydra's argparse takes the overrides as one
    # positional list, so an override after a flag (`... --cfg job hydra.sweep.dir=...`) is refused.
    sys.argv = ["stabexp", *flags_first(args), *extra]
    unfinished.JOBS.clear()
    try:
        _hydra_main()()
    finally:
        for e in extra:
            if e.startswith("hydra.sweep.dir=") and not distributed.is_rank0():
                shutil.rmtree(e.split("=", 1)[1].strip("'"), ignore_errors=True)
    if unfinished.JOBS and distributed.is_rank0():
        print(f"stabexp: error: {len(unfinished.JOBS)} job(s) of the sweep did not finish (the others ran):",
              file=sys.stderr)
        for out_dir, why in unfinished.JOBS:
            print(f"  {out_dir}: {why}", file=sys.stderr)
        return 1
    return 0


def _preset_description(path: Path) -> str:
    """The first comment line of a preset file after `# @package`: what it reproduces."""
    lines = [line[1:].strip() for line in path.read_text().splitlines()
             if line.startswith("#") and "@package" not in line]
    return lines[0] if lines else ""


LIST_USAGE = """usage: stabexp list [--config-dir DIR]
  the control groups (group=NAME), the experiment presets (experiment=NAME) with what each costs,
  and the plug-ins found; --config-dir adds a folder of your own groups and presets"""


def cmd_list(args: List[str] = ()) -> int:
    from stabexp.presets import line as cost_line

    if {"-h", "--help"} & set(args):
        print(LIST_USAGE)
        return 0
    try:
        user_dirs = user_config_dirs(list(args))
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    rows = []
    for path in config_files("group", user_dirs):
        g = yaml.safe_load(path.read_text()) or {}
        rows.append((g.get("name", path.stem), g.get("description", ""), g.get("citation", "")))
    if not rows:
        print(f"stabexp: error: no control group found in {conf_dir() / 'group'}: the package's configs "
              "are missing (reinstall stabexp, or set STABEXP_CONF to a folder holding them)", file=sys.stderr)
        return 1
    width = max(len(r[0]) for r in rows)
    print("Control groups (group=NAME):")
    for name, description, citation in rows:
        print(f"  {name:<{width}}  {description}")
        print(f"  {'':<{width}}  [{citation}]")
    presets = config_files("experiment", user_dirs)
    width = max((len(p.stem) for p in presets), default=0)
    print("\nExperiment presets (stabexp run experiment=NAME [scale=quick]; all: make reproduce):")
    for path in presets:
        print(f"  {path.stem:<{width}}  {_preset_description(path)}")
        said = cost_line(path)
        if said is not None:
            print(f"  {'':<{width}}  cost: {said}")
    # Plug-ins (docs/plugins.md): other packages' entry points, read without importing them,
    # and the groups whose placement or init rule is a dotted path to a user's module.
    from stabexp import plugins

    found = plugins.plugins()
    if found:
        width = max(len(f"{p.kind} {p.name}") for p in found)
        print("\nPlug-ins of other packages (entry points):")
        for p in found:
            print(f"  {f'{p.kind} {p.name}':<{width}}  {p.value}  [{p.distribution}]")
    dotted = []
    for path in config_files("group", user_dirs):
        g = yaml.safe_load(path.read_text()) or {}
        keys = [f"{key}: {g[key]}" for key in ("residual", "encoder_residual", "decoder_residual", "init")
                if plugins.is_dotted_path(g.get(key))]
        if keys:
            dotted.append((g.get("name", path.stem), ", ".join(keys), path))
    if dotted:
        width = max(len(name) for name, *_ in dotted)
        print("\nGroups with a plug-in (a dotted path, imported from PYTHONPATH when the group runs):")
        for name, keys, path in dotted:
            print(f"  {name:<{width}}  {keys}  ({path})")
    print(f"\nConfigs: {', '.join(str(d) for d in (conf_dir(), *user_dirs))}; run folders: {outputs_dir()}")
    return 0


def version_line() -> str:
    import platform

    import torch

    from stabexp.train.folder import code_version

    return f"stabexp {code_version()} (torch {torch.__version__}, Python {platform.python_version()})"


COMMANDS = ("run", "list", "status", "report", "claims", "bench", "export", "export-tensorboard")
COMPLETION = ("-sc", "--shell-completion")


def complete(args: List[str]) -> int:
    """Hydra's shell completion under a subcommand. Its installed script asks `stabexp -sc
    query=bash` with the line typed so far in COMP_LINE: the subcommand's name is completed here,
    and `run`'s overrides by Hydra on the line without `run` (Hydra reads every word after the
    program's name as an override)."""
    import os

    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    if not any(a.startswith("query=") for a in args):
        return _hydra_completion(args)  # install= / uninstall=: Hydra prints the script
    typing_command = len(words) == 1 or (len(words) == 2 and not line.endswith(" "))
    if typing_command:
        typed = words[1] if len(words) == 2 else ""
        print(" ".join(c for c in COMMANDS if c.startswith(typed)))
        return 0
    if len(words) < 2 or words[1] != "run":
        return 0
    os.environ["COMP_LINE"] = " ".join([words[0], *words[2:]]) + (" " if line.endswith(" ") else "")
    return _hydra_completion(args)


def _hydra_completion(args: List[str]) -> int:
    sys.argv = ["stabexp", *args]
    _hydra_main()()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """The console script: a reader that stops early (`stabexp list | head -2`) ends the output,
    not the command: a run goes on to its end, writing its files, and the exit code is its own."""
    from stabexp.terminal import quiet_when_closed, stdout_closed, stdout_reader_gone

    with quiet_when_closed():
        try:
            return _main(sys.argv[1:] if argv is None else argv)
        except BrokenPipeError:
            if not stdout_reader_gone():  # another pipe broke: an error of its own
                raise
            stdout_closed()
            return 0


def _main(argv: List[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.format(outputs=outputs_dir()))
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return 0
    if argv[0] in COMPLETION or (argv[0] == "run" and set(COMPLETION) & set(argv[1:])):
        return complete([a for a in argv if a != "run"])
    command, rest = argv[0], argv[1:]
    if command == "run":
        return cmd_run(rest)
    if command == "list":
        return cmd_list(rest)
    if command == "status":
        from stabexp.status import main as status_main

        return status_main(rest)
    if command == "report":
        from stabexp.report import main as report_main

        return report_main(rest)
    if command == "claims":
        from stabexp.claims.command import main as claims_main

        return claims_main(rest)
    if command == "plan":
        from stabexp.plan import main as plan_main

        return plan_main(rest)
    if command == "bench":
        from stabexp.bench import main as bench_main

        return bench_main(rest)
    if command == "export":
        from stabexp.export import main as export_main

        return export_main(rest)
    if command == "export-tensorboard":
        from stabexp.tracking.export import main as export_tensorboard_main

        return export_tensorboard_main(rest)
    print(f"stabexp: error: unknown command {command!r}: use run, list, status, report, claims, plan, "
          "bench, export or export-tensorboard", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
