"""What the terminal sees: output whose reader has gone, and progress while a run trains.

A command piped into a reader that stops early (`stabexp list | head -2`, `stabexp run ... |
head -1`) keeps going with its output sent nowhere, as a run writes its files whatever its
terminal does; no BrokenPipeError traceback, from a print or from a logging handler.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager


def stdout_closed() -> None:
    """The reader of stdout has gone: send what is still to come (and what is buffered) to
    os.devnull, so later writes and the interpreter's last flush succeed."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno())
    finally:
        os.close(devnull)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.__stdout__.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no real stdout
        return False


class _ReaderMayLeave:
    """sys.stdout that survives its reader: a write or flush into a closed pipe moves stdout to
    os.devnull and carries on (logging handlers hold this object, so they do too)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            stdout_closed()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            stdout_closed()

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextmanager
def quiet_when_closed():
    """For the console script: sys.stdout survives a reader that stops early. Only the real
    stdout is wrapped (a test's captured stream is left alone)."""
    real = sys.stdout
    if real is None or real is not sys.__stdout__:
        yield
        return
    sys.stdout = _ReaderMayLeave(real)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = real


def duration(seconds: float) -> str:
    """`2 h 5 min`, `3 min 20 s`, `45 s`."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s"


class Counter:
    """Progress through `total` pieces of work, on stderr: a tqdm bar on a terminal, otherwise a
    `# what: done/total, time left` line at most every `seconds` (a log stays short)."""

    def __init__(self, total: int, what: str, seconds: float = 30.0):
        import time

        self.total, self.what, self.seconds, self.done = total, what, seconds, 0
        self.started = self.last_line = time.perf_counter()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, leave=False, dynamic_ncols=True)
        else:
            print(f"# {what}: 0/{total}", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        import time

        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.perf_counter()
        if now - self.last_line >= self.seconds and self.done < self.total:
            self.last_line = now
            left = (now - self.started) / self.done * (self.total - self.done)
            print(f"# {self.what}: {self.done}/{self.total}, about {duration(left)} left", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
