"""The console script: `stabexp COMMAND ARGS`, each command a function of its arguments
(COMMANDS, imported when used), the usage, and shell completion. `stabexp run` is the Hydra app
of stabexp.app.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import List, Optional

from stabexp.paths import outputs_dir

# Every command: (its arguments, what it does, the function that runs it on its arguments,
# imported when used).
COMMANDS = {
    "run": ("[OVERRIDES] [-m] [--cfg job] [--help]", "train one run, or a sweep with -m", "stabexp.app:main"),
    "list": ("[--config-dir DIR]", "the control groups and experiment presets, with their cost", "stabexp.listing:main"),
    "status": ("[SWEEP_DIR]", "every run of a sweep: completed, running, ...", "stabexp.status:main"),
    "report": ("[SWEEP_DIR]", "a sweep as a markdown table (group x depth)", "stabexp.report:main"),
    "claims": ("[PATH ...] [--json] [--record FILE]", "every paper claim's verdict, computed from the runs",
               "stabexp.claims.command:main"),
    "plan": ("[OVERRIDES] [--world K] [--gpu-memory GB]", "what one run needs per rank on K GPUs (nothing trained)",
             "stabexp.plan:main"),
    "bench": ("[--sizes tiny,small] [--depths 6,18,50]", "speed and memory against torch.nn.Transformer",
              "stabexp.bench:main"),
    "export": ("RUN_FOLDER [OUT_FILE]", "an Admin run's final weights as a Post-LN model", "stabexp.export:main"),
    "export-tensorboard": ("SWEEP_DIR [--logdir DIR]", "finished run folders as TensorBoard event files",
                           "stabexp.tracking.export:main"),
}


def usage() -> str:
    lines = [f"stabexp {name} {args}" for name, (args, _, _) in COMMANDS.items()] + ["stabexp --version"]
    said = [what for _, what, _ in COMMANDS.values()] + ["stabexp's version, torch's and Python's"]
    width = max(len(line) for line in lines)
    text = "\n".join(f"{'usage: ' if i == 0 else '       '}{line:<{width}}  {what}"
                     for i, (line, what) in enumerate(zip(lines, said)))
    return text + f"""
Shell completion of run's overrides (bash; zsh through bashcompinit):
  eval "$(stabexp run -sc install=bash)"
Examples:
  stabexp run group=postln depth=18
  stabexp run -m group=postln,postln_warmup depth=6,18
  stabexp run experiment=deepnet_depth scale=quick
Run folders go under {outputs_dir()}"""


def version_line() -> str:
    import platform

    import torch

    from stabexp.train.folder import code_version

    return f"stabexp {code_version()} (torch {torch.__version__}, Python {platform.python_version()})"


COMPLETION = ("-sc", "--shell-completion")


def complete(args: List[str]) -> int:
    """Hydra's shell completion under a subcommand. Its installed script asks `stabexp -sc
    query=bash` with the line typed so far in COMP_LINE: the subcommand's name is completed here,
    and `run`'s overrides by Hydra on the line without `run` (Hydra reads every word after the
    program's name as an override)."""
    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    if any(a.startswith("query=") for a in args):  # else install= / uninstall=: Hydra prints the script
        if len(words) == 1 or (len(words) == 2 and not line.endswith(" ")):  # typing the command
            typed = words[1] if len(words) == 2 else ""
            print(" ".join(c for c in COMMANDS if c.startswith(typed)))
            return 0
        if len(words) < 2 or words[1] != "run":
            return 0
        os.environ["COMP_LINE"] = " ".join([words[0], *words[2:]]) + (" " if line.endswith(" ") else "")
    from stabexp.app import hydra_app

    sys.argv = ["stabexp", *args]
    hydra_app()()
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
        except OSError as err:
            from stabexp.errors import cannot_write

            line = cannot_write(err)
            if line is None:
                raise
            print(f"stabexp: error: {line}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            # Ctrl-C outside a run's steps (Hydra composing, a second Ctrl-C, a report): one line,
            # and the shell's code for SIGINT. A run between steps checkpoints and says so itself.
            print("stabexp: interrupted (Ctrl-C)", file=sys.stderr)
            return 128 + signal.SIGINT


def _main(argv: List[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return 0
    if argv[0] in COMPLETION or (argv[0] == "run" and set(COMPLETION) & set(argv[1:])):
        return complete([a for a in argv if a != "run"])
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"stabexp: error: unknown command {command!r}: use one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, function = COMMANDS[command][2].split(":")
    return getattr(importlib.import_module(module), function)(rest)


if __name__ == "__main__":
    sys.exit(main())
