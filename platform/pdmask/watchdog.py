"""A trial or job that stops making progress ends, with its reason, within a bound.

One mechanism for both launch kinds: a thread next to the training loop that the loop ``beat``s
at every finished step (or validation), and that calls its fault action when either holds:

- **a stall**: no beat for the stall bound, or no first beat within ``startup_seconds`` (model
  loading, engine start, the first weight sync);
- **a failed probe**: ``probe()`` returns a reason (the VeRL job's probe asks its vLLM servers
  whether their engines live: ``backends/verl/watchdog.py``).

The stall bound is ``stall_seconds``, or ``stall_steps`` times the longest interval between two
beats seen so far when that is longer: a trial whose steps take 2 s is failed after a minute of
silence, one whose steps take 5 minutes is never failed for its own pace.

The fault action records the reason on the trial's MLflow run (``WATCHDOG_TAG`` and the failure
reason) and ends the process, which Ray sees as a crashed trial or a failed job: the sweep
retries it from its checkpoint like any crash. Where it runs: the Tune trainable
(``orchestration/tune/trainable.py``) and verl's TaskRunner (``backends/verl/trainer.py``).

A site tunes the bounds with ``PDM_STALL_SECONDS`` and ``PDM_STARTUP_SECONDS`` (``site_bounds``);
each launch kind has its documented defaults where it builds its ``Bounds``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pdmask.errors import ConfigError

WATCHDOG_ENV = "PDM_WATCHDOG"  # a VeRL job's bounds, in its runtime environment (JSON)
WATCHDOG_TAG = "pdm.watchdog"  # the fault's reason on the run, read by the sweep that retries it
STALL_ENV = "PDM_STALL_SECONDS"
STARTUP_ENV = "PDM_STARTUP_SECONDS"


@dataclass(frozen=True)
class Bounds:
    """How long a trial or job may go without progress (seconds)."""

    startup_seconds: float
    stall_seconds: float
    poll_seconds: float = 10.0
    stall_steps: float = 0.0  # 0: the stall bound is stall_seconds, whatever the step time

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, env=None) -> Bounds | None:
        raw = (os.environ if env is None else env).get(WATCHDOG_ENV)
        return cls(**json.loads(raw)) if raw else None


def site_bounds(env=None) -> tuple[float | None, float | None]:
    """The site's ``(stall, startup)`` seconds from ``PDM_STALL_SECONDS`` / ``PDM_STARTUP_SECONDS``
    (None where unset); a value that is not a positive number is a ``ConfigError`` naming it."""
    env = os.environ if env is None else env
    values, problems = [], []
    for name in (STALL_ENV, STARTUP_ENV):
        raw = (env.get(name) or "").strip()
        try:
            value = float(raw) if raw else None
        except ValueError:
            value = -1.0
        if value is not None and not (math.isfinite(value) and value > 0):
            problems.append(f"{name}={raw!r}: not a positive number of seconds")
        values.append(value)
    if problems:
        raise ConfigError("; ".join(problems))
    return values[0], values[1]


class Watchdog:
    """Decides, from beats and its probe, when the work has stopped (see the module)."""

    def __init__(
        self,
        bounds: Bounds,
        on_fault: Callable[[str], None],
        probe: Callable[[], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.bounds = bounds
        self.on_fault = on_fault
        self.probe = probe
        self.clock = clock
        self._started = clock()
        self._last_beat: float | None = None
        self._longest_interval = 0.0
        self._last_what = "start-up"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, what: str) -> None:
        """Progress: ``what`` just finished (e.g. ``step 3``)."""
        now = self.clock()
        if self._last_beat is not None:
            self._longest_interval = max(self._longest_interval, now - self._last_beat)
        self._last_beat = now
        self._last_what = what

    def stall_bound(self) -> float:
        return max(self.bounds.stall_seconds, self.bounds.stall_steps * self._longest_interval)

    def cause(self) -> str | None:
        """What the probe finds wrong now, or None; asked when the work failed on its own, so
        that the failure names its cause (a dead vLLM engine) whichever side noticed it first.
        Best effort: a probe that cannot answer leaves the failure's own account."""
        if self.probe is None:
            return None
        try:
            return self.probe() or None
        except Exception:
            return None

    def fault(self) -> str | None:
        """Why the work must end now, or None."""
        if self.probe is not None:
            reason = self.probe()
            if reason:
                return reason
        now = self.clock()
        if self._last_beat is None:
            if now - self._started > self.bounds.startup_seconds:
                return (
                    f"stalled: no training step or validation finished within "
                    f"{self.bounds.startup_seconds:.0f} s of the start (start-up bound)"
                )
            return None
        bound = self.stall_bound()
        if now - self._last_beat > bound:
            return (
                f"stalled: no progress for {now - self._last_beat:.0f} s after {self._last_what} "
                f"(stall bound {bound:.0f} s)"
            )
        return None

    # ------------------------------------------------------------ thread
    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._run, name="pdm-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.bounds.poll_seconds):
            try:
                reason = self.fault()
            except Exception as err:  # the watchdog must never be what kills healthy work
                print(
                    f"pdmask watchdog: check failed ({type(err).__name__}: {err})", file=sys.stderr
                )
                continue
            if reason and not self._stop.is_set():
                self.on_fault(reason)
                return


def end_process(reason: str, record: Callable[[str], None]) -> None:
    """A fault action: say why, ``record`` it on the run (best effort), end this process now.

    ``os._exit``: the stalled loop may be blocked in C code or holding locks that a normal exit
    would wait on forever."""
    print(f"pdmask watchdog: ending: {reason}", file=sys.stderr, flush=True)
    try:
        record(reason)
    except Exception as err:  # an unreachable store must not keep stalled work alive
        print(f"pdmask watchdog: could not record it in MLflow: {err}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)
