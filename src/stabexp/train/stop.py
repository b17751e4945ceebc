"""Requests to stop a run (SIGTERM, SIGINT, SIGUSR1: what a user, a scheduler or SLURM before a
preemption sends), noted when they arrive and acted on at the end of the step, where the run's
state is whole and can be checkpointed.

A handler that was there before ours (submitit's, which requeues a SLURM job on its preemption
signal, USR2 by default) is called after the checkpoint is written, so the requeued job finds it.
A second SIGINT stops at once (Ctrl-C twice), without a checkpoint.
"""

from __future__ import annotations

import signal
import threading
from typing import Dict, Optional

# SIGUSR2 is submitit's preemption signal: ours only when someone already handles it.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
CHAINED_ONLY = (signal.SIGUSR2,)


class RunStopped(BaseException):
    """The run stopped on request after writing its checkpoint (a BaseException, as
    KeyboardInterrupt: it is not a failure of the run)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequests:
    def __init__(self):
        self.received: Optional[int] = None
        self.previous: Dict[int, object] = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is not threading.main_thread():
            return self  # Python only lets the main thread handle signals
        for signum in SIGNALS + CHAINED_ONLY:
            previous = signal.getsignal(signum)
            if signum in CHAINED_ONLY and not callable(previous):
                continue
            self.previous[signum] = previous
            signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self.previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self.previous = {}

    def _note(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def pass_on(self, signum: Optional[int] = None) -> None:
        """After the checkpoint: hand the signal to the handler that was there before ours
        (submitit requeues and exits; Python's SIGINT handler raises KeyboardInterrupt), then
        stop. `signum`: the signal the ranks of a run on K processes agreed on, which this
        rank may not have received itself (then it only stops)."""
        received = self.received
        signum = received if signum is None else signum
        previous = self.previous.get(signum) if received is not None else None
        self.__exit__()
        # Python's own SIGINT handler would only raise KeyboardInterrupt, a traceback where the
        # run has stopped as asked: RunStopped says it.
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, None)
        raise RunStopped(signum)
