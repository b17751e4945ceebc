"""The jobs of this process's sweep that did not finish, (run folder, why) each: added where a
job ends early (the task function, a packed job's process, the packed launcher carrying its
jobs' words back) and summed up by `stabexp run` at the sweep's end. A module of its own, that
imports nothing, so that the command line, the sweep and the launcher share it without
importing each other."""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

JOBS: List[Tuple[Path, str]] = []
