"""A run folder's files: the tidy CSV logs, summary.json, and the lock that keeps one process
per folder. Every write that replaces a file is atomic (temp file, fsync, rename), so a kill at
any moment leaves either the old file or the new one, never half of one.

A run on K processes (stabexp.distributed) writes its files from rank 0 alone: the writers
here do nothing on the other ranks, which compute the same rows.

Every JSON file stabexp writes is strict JSON (`json_text`): a diverged run's NaN loss is written
as null, with the object's `non_finite` saying which numbers those were (docs/outputs.md), since
strict readers (JavaScript, jq, most other languages) refuse Python's NaN and Infinity.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from stabexp.atomic import write_atomic
from stabexp.distributed import is_rank0
from stabexp.errors import ConfigError

# What a run folder's files that cannot be resumed leave to do.
START_OVER = "overwrite=true starts the run over (its files replaced)"

SUMMARY = "summary.json"
MODEL = "model.pt"  # the final weights, with train.save_model
# What two runs of one config may write differently: the wall-clock columns and summary fields,
# the process's peak memory, and the folder itself (a resumed run, or the same run elsewhere).
WALL_CLOCK = ("elapsed_s", "wall_seconds", "steps_per_second", "finish_seconds", "peak_memory_mib",
              "memory_before_model_mib", "memory_before_model_mib_ranks",
              "peak_memory_mib_ranks", "resumed_from", "out_dir")
LOCK = "run.lock"
NON_FINITE = "non_finite"  # in a JSON file: the path of each number written as null -> "nan", "inf", "-inf"


def json_text(data, **options) -> str:
    """`data` as strict JSON (indent 2 unless `options` say otherwise). A non-finite number is
    written as null, and the object at the top (each object of a top-level list) records it in
    `non_finite`, {path: "nan" | "inf" | "-inf"}, the path its keys and list positions joined
    by "." ("last_loss", "constants.rezero_alpha.0"); read_json puts it back."""
    plain = [_recorded(item) for item in data] if isinstance(data, (list, tuple)) else _recorded(data)
    return json.dumps(plain, allow_nan=False, **{"indent": 2, **options}) + "\n"


def _recorded(data):
    found: Dict[str, str] = {}
    plain = _nulled(data, "", found)
    if found and isinstance(plain, dict):  # added to the record of an object read back as plain JSON
        plain[NON_FINITE] = {**plain.get(NON_FINITE, {}), **found}
    return plain


def _nulled(value, path: str, found: Dict[str, str]):
    if isinstance(value, dict):
        return {key: _nulled(v, f"{path}{key}.", found) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulled(v, f"{path}{i}.", found) for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    number = float(value)  # numpy and torch scalars too
    if math.isfinite(number):
        return number
    found[path[:-1]] = "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")
    return None


def _put_back(value, path: str, record: Dict[str, str]):
    if isinstance(value, dict):
        return {key: _put_back(v, f"{path}{key}.", record) for key, v in value.items()}
    if isinstance(value, list):
        return [_put_back(v, f"{path}{i}.", record) for i, v in enumerate(value)]
    spelled = record.get(path[:-1])
    return float(spelled) if value is None and spelled in ("nan", "inf", "-inf") else value


def write_json(path: Path, data: Dict) -> None:
    if not is_rank0():
        return
    text = json_text(data).encode()
    write_atomic(path, lambda f: f.write(text))


def read_json(path: Path):
    """A JSON file as written: the numbers json_text wrote as null are NaN and inf again (and a
    file of an older stabexp, which wrote NaN and Infinity as such, reads the same)."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and isinstance(data.get(NON_FINITE), dict):
        return _put_back(data, "", data.pop(NON_FINITE))
    return data


def write_csv(path: Path, columns, rows) -> None:
    """A whole CSV file at once, atomically (for files written at a few steps only)."""
    if not is_rank0():
        return
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows(rows)
    data = text.getvalue().encode()
    write_atomic(path, lambda f: f.write(data))


def read_csv_rows(path: Path):
    """The rows of a CSV file as dicts of strings; [] when it does not exist."""
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_run_table(path: Path):
    """A run's CSV file (metrics.csv, layers.csv, a probe's own) as a pandas frame of its rows up
    to the last whole one; an empty frame where the file is missing or empty. A run killed in the
    middle of a write can leave its last row cut short, with no line end: that row is left out
    with a warning, never read as whole (a cut `3,0.001,2` would read step 3's loss as 2)."""
    import logging

    import pandas as pd

    path = Path(path)
    data = path.read_bytes() if path.is_file() else b""
    if data and not data.endswith(b"\n"):
        whole = data.rfind(b"\n") + 1
        logging.getLogger("stabexp").warning("%s: its last row is cut short (%d bytes with no line end): left out",
                                             path, len(data) - whole)
        data = data[:whole]
    return pd.read_csv(io.BytesIO(data)) if data else pd.DataFrame()


def read_header(path: Path) -> Optional[List[str]]:
    """A CSV file's columns; None when it does not exist or is empty."""
    if not Path(path).exists():
        return None
    with open(path, newline="") as f:
        return next(csv.reader(f), None)


# The keys of a run's summary.json whose readers (the trainer, collect, the claims, the report)
# need their type: a file with one of them of another type (a hand edit, another program's file)
# is not a run's summary, and its readers skip it rather than fail on it.
SUMMARY_TYPES = {"status": str, "depth": int, "decoder_depth": int, "seed": int, "steps": int,
                 "steps_done": int, "optim": dict, "theory": dict, "data": dict, "constants": dict,
                 "code_versions": list}


def summary_problem(data) -> Optional[str]:
    """Why `data` (summary.json as read) is not a run's summary; None when it is one."""
    if not isinstance(data, dict):
        kind = {"list": "a list", "int": "a number", "float": "a number", "str": "a string"}.get(type(data).__name__, "no mapping")
        return f"it holds {kind}, not a mapping of a run's fields"
    for key, kind in SUMMARY_TYPES.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            return f"its {key!r} is {json.dumps(value)[:40]}, where a run's summary has a{'n' * (kind is int)} {kind.__name__}"
    return None


def summary_file_problem(path: Path) -> Optional[str]:
    """Why the summary.json at `path` cannot be read as a run's; None when it can."""
    path = Path(path)
    if not path.is_file():  # a folder, or a FIFO, which reading would wait on for ever
        return "it is not a regular file"
    try:
        return summary_problem(read_json(path))
    except (ValueError, OSError) as err:  # not JSON, not text at all, unreadable
        return f"it cannot be read as JSON ({str(err).splitlines()[0][:60]})"


def find_runs(outputs: Path) -> List[Path]:
    """Every run folder under `outputs` (a folder holding a summary.json), in order; the
    collected tables and figures made from them are not runs. Only the folders below `outputs`
    are tested for those names: an outputs folder that itself sits in a folder named `figures`
    keeps its runs."""
    root = Path(outputs)
    return sorted(p.parent for p in root.rglob(SUMMARY)
                  if not {"collected", "figures"} & set(p.relative_to(root).parts))


def read_summary(out_dir: Path) -> Optional[Dict]:
    """A run folder's summary.json; None when it has none, or when what it has is not a run's
    summary (summary_file_problem says why)."""
    path = Path(out_dir) / SUMMARY
    if not path.is_file():  # none, or a folder or a FIFO in its place
        return None
    try:
        data = read_json(path)
    except (ValueError, OSError):
        return None
    return data if summary_problem(data) is None else None


class CsvLog:
    """Append-only CSV writer, flushed per write so an interrupted run keeps its rows.

    `position()` is (data rows, bytes) so far: a checkpoint records it, and a resumed run
    reopens the file cut back to it (`resume_at`), dropping the rows written after that
    checkpoint, which the resumed run writes again. `on_write` sees every row as written (the
    trackers, stabexp.tracking)."""

    def __init__(self, path: Path, columns, resume_at: Optional[Tuple[int, int]] = None,
                 on_write: Optional[Callable[[List[Dict]], None]] = None):
        self.path, self.columns = Path(path), list(columns)
        self.on_write = on_write
        self.file = None
        if not is_rank0():  # rank 0 writes the rows (and its checkpoint records the positions)
            self.rows = 0
        elif resume_at is None:
            self.file = open(self.path, "w", newline="")
            self.writer = csv.DictWriter(self.file, fieldnames=self.columns)
            self.writer.writeheader()
            self.rows = 0
        else:
            rows, size = resume_at
            self.columns = self._resumed_columns()
            if self.path.stat().st_size < size:
                raise ConfigError(f"{self.path} is shorter ({self.path.stat().st_size} bytes) than at its "
                                  f"checkpoint ({size} bytes): the run cannot be resumed from it; "
                                  f"{START_OVER}")
            self.file = open(self.path, "r+", newline="")
            self.file.truncate(size)
            self.file.seek(size)
            self.writer = csv.DictWriter(self.file, fieldnames=self.columns, extrasaction="ignore")
            self.rows = rows
        if self.file is not None:
            self.file.flush()

    @classmethod
    def cut_at_step(cls, path: Path, columns, step: int, on_write=None) -> "CsvLog":
        """Reopened for a resumed run whose checkpoint (of an older stabexp) has no position
        for this file: its rows up to `step` kept, the later ones cut, as `resume_at` would."""
        path = Path(path)
        if not is_rank0() or not path.exists():
            return cls(path, columns, on_write=on_write)
        kept = [r for r in read_csv_rows(path) if int(r["step"]) <= step]
        write_csv(path, read_header(path), kept)
        return cls(path, columns, resume_at=(len(kept), path.stat().st_size), on_write=on_write)

    def _resumed_columns(self) -> List[str]:
        """The file's own columns: a run started by an older stabexp, resumed by a newer one
        that writes columns more (a probe added since), goes on in the file's columns, and the
        file stays one table, as the older version writes it."""
        with open(self.path, newline="") as f:
            header = next(csv.reader(f), None)
        if not header or header[0] != self.columns[0]:
            shown = ",".join(header or [])[:60]
            raise ConfigError(f"{self.path} begins with the columns {shown!r}, where this run's begin with "
                              f"{self.columns[0]!r}: the run cannot be resumed from it; {START_OVER}")
        return header

    def write(self, rows) -> None:
        self.rows += len(rows)
        if self.file is not None:
            self.writer.writerows(rows)
            self.file.flush()
        if self.on_write is not None:
            self.on_write(rows)

    def position(self) -> Tuple[int, int]:
        if self.file is None:
            return self.rows, 0
        self.file.flush()
        return self.rows, self.file.tell()

    def sync(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class RunLocked(RuntimeError):
    """Another live process holds the run folder."""


class RunLock:
    """One process per run folder: an exclusive flock on run_folder/run.lock, which the kernel
    releases when its process dies however it dies, so a lock left by a killed run is simply
    taken over. The file says who holds it (host, pid, since) for the message of the process
    that finds it taken; it is removed when the run ends. flock works across the hosts of a
    cluster on NFS v4 (Linux emulates it with POSIX locks there)."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / LOCK
        self.file = None
        self.previous_holder: Optional[str] = None  # a dead holder whose lock was taken over

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise RunLocked(_held(self.path.parent, holder)) from None
        try:
            same_file = os.path.samestat(os.fstat(f.fileno()), os.stat(self.path))
        except FileNotFoundError:
            same_file = False
        if not same_file:  # its holder ended and removed it between our open and our flock
            f.close()
            return self.acquire()
        f.seek(0)
        self.previous_holder = f.read().strip() or None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        self.file = f
        return self

    def release(self) -> None:
        if self.file is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
        self.file.close()
        self.file = None


def _held(out_dir: Path, holder: str) -> str:
    return (f"{out_dir} is being run by {holder}: wait for it, or stop that process (its lock is taken "
            "over once it has died)")


def locked_message(out_dir: Path) -> Optional[str]:
    """The one line for a run folder that a live process holds; None when it is free."""
    if not is_locked(out_dir):
        return None
    try:
        holder = (Path(out_dir) / LOCK).read_text().strip()
    except FileNotFoundError:  # its holder ended meanwhile
        return None
    return _held(Path(out_dir), holder or "another process")


def is_locked(out_dir: Path) -> bool:
    """Whether a live process holds the run folder's lock (tried, and released at once)."""
    path = Path(out_dir) / LOCK
    if not path.exists():
        return False
    with open(path) as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return False


def current_status(run: Path, recorded: Optional[str]) -> str:
    """A run folder's status as it stands: the one its summary records (`recorded`), but
    "interrupted" for a recorded "running" that no process holds; without a summary, running
    (a process holds the folder) or not started."""
    if recorded is None:
        return "running" if is_locked(run) else "not started"
    if recorded == "running" and not is_locked(run):
        return "interrupted"  # killed: nobody holds its lock any more
    return recorded
