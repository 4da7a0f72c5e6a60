"""Ctrl-C, SIGTERM and SIGHUP during a sweep: stop in order, resumable, one exit code.

While a sweep runs, SIGINT, SIGTERM and SIGHUP (its terminal closed) never raise in the middle of
whatever the driver is doing (starting Ray, talking to the store, shutting Ray down): the first
one only asks the sweep to stop (``Interrupts.event``). Its launcher stops (Tune stops the running
trials, the job loop detaches from its jobs), the runs left RUNNING without a job are marked
KILLED, and the command exits with ``EXIT_INTERRUPTED`` whatever the moment of the signal. A
second signal says it is still stopping; a third gives up at once (the reaper still removes Ray's
processes; the next run repairs the runs' states).

SIGINT is handled even where the sweep inherited it ignored (a script's background job), since
Ctrl-C is how a user stops it; SIGHUP is left ignored where it was (``nohup pdm sweep ...``: the
user asked the sweep to outlive the terminal).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's code for an interrupted command
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GIVE_UP_AFTER = 3  # signals


class Interrupts:
    """Counts stop requests; ``requested`` turns True at the first."""

    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()
        self.signals: tuple[int, ...] = ()  # those handled (set by ``handled``; none off it)

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def install(self) -> None:
        """(Re)install the handlers. Ray's driver replaces the SIGTERM handler with its own (it
        aborts the process) when it starts: the runner installs these again after ray.init."""
        for s in self.signals:
            signal.signal(s, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.count += 1
        self.event.set()
        name = signal.Signals(signum).name
        if self.count >= GIVE_UP_AFTER:
            sys.stderr.write(f"\n{name} x{self.count}: exiting now (run again to resume)\n")
            os._exit(EXIT_INTERRUPTED)
        hint = "stopping trials; they resume next time" if self.count == 1 else "still stopping"
        sys.stderr.write(f"\n{name}: {hint} ({GIVE_UP_AFTER - self.count} more to exit now)\n")


@contextmanager
def handled() -> Iterator[Interrupts]:
    """Install the handlers for the block (main thread only), restore the previous ones after."""
    interrupts = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield interrupts
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    interrupts.signals = tuple(
        s for s in SIGNALS if not (s == signal.SIGHUP and previous[s] == signal.SIG_IGN)
    )
    interrupts.install()
    try:
        yield interrupts
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
