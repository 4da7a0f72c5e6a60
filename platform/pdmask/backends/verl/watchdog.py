"""A VeRL job that stops making progress ends, with the reason in its MLflow run, within a bound.

verl 0.9.1 has no timeout on its weight sync: the trainer sends buckets to vLLM's workers over ZMQ
and waits for each acknowledgement. When a vLLM worker raises during the sync, or the engine core
dies, nothing acknowledges; the job's actors stay alive and idle and the job never ends. Days of a
cluster's GPUs can go that way, and CI's time limit in minutes.

The watchdog is a thread in the TaskRunner (the process that drives verl's trainer loop, started
by ``trainer.PDMTrainerSync``). It ends the job when either holds:

- **a dead engine**: every ``poll_seconds`` it asks each of the job's vLLM servers
  (``vllm_server.TopKvLLMHttpServer.engine_error``) whether its engine lives; a dead engine, or a
  server actor that is gone, is a fault at once;
- **a stall**: no progress (``beat``: the end of a training step or of a validation) for
  ``stall_seconds``, or ``startup_seconds`` until the first beat (model loading, engine start, the
  first weight sync and the validation before training).

On a fault it prints the reason, marks the trial's run FAILED with the reason in
``pdm.failure_reason`` and ``pdm.watchdog`` (the sweep's job loop puts the latter first in the
attempt's failure reason) and exits the TaskRunner's process, which makes verl's driver raise and
the Ray job end FAILED; the sweep then retries it from its last checkpoint like any failed attempt.
It works the same whether or not a ``pdm sweep`` is attached.

The bounds reach the job as ``WATCHDOG_ENV`` (set by the job builder from the cluster profile
and the model's step time, ``jobs_setup.watchdog_bounds``); a job without them runs unwatched.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

WATCHDOG_ENV = "PDM_WATCHDOG"
WATCHDOG_TAG = "pdm.watchdog"
ASK_TIMEOUT_S = (
    30.0  # a server that cannot answer this long is busy, not dead: the stall bound decides
)


@dataclass(frozen=True)
class Bounds:
    """How long a job may go without progress (seconds)."""

    startup_seconds: float
    stall_seconds: float
    poll_seconds: float = 10.0

    def to_env(self) -> str:
        return json.dumps(
            {
                "startup_seconds": self.startup_seconds,
                "stall_seconds": self.stall_seconds,
                "poll_seconds": self.poll_seconds,
            }
        )

    @classmethod
    def from_env(cls, env=None) -> Bounds | None:
        raw = (os.environ if env is None else env).get(WATCHDOG_ENV)
        return cls(**json.loads(raw)) if raw else None


class JobWatchdog:
    """Decides, from beats and the servers' answers, when a job has stopped (see the module)."""

    def __init__(
        self,
        bounds: Bounds,
        servers: Callable[[], Iterable],
        on_fault: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.bounds = bounds
        self.servers = servers  # the job's vLLM server actors (empty until verl has made them)
        self.on_fault = on_fault
        self.clock = clock
        self._started = clock()
        self._last_beat: float | None = None
        self._last_what = "start-up"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, what: str) -> None:
        """Progress: ``what`` just finished (e.g. ``step 3``)."""
        self._last_beat = self.clock()
        self._last_what = what

    def fault(self) -> str | None:
        """Why the job must end now, or None."""
        engine = self._dead_engine()
        if engine:
            return engine
        now = self.clock()
        if self._last_beat is None:
            if now - self._started > self.bounds.startup_seconds:
                return (
                    f"stalled: no training step or validation finished within "
                    f"{self.bounds.startup_seconds:.0f} s of the job's start (start-up bound)"
                )
        elif now - self._last_beat > self.bounds.stall_seconds:
            return (
                f"stalled: no progress for {now - self._last_beat:.0f} s after {self._last_what} "
                f"(stall bound {self.bounds.stall_seconds:.0f} s)"
            )
        return None

    def _dead_engine(self) -> str | None:
        import ray

        for server in self.servers():
            ask = getattr(server, "engine_error", None)
            if ask is None:  # not pdmask's server: nothing to ask
                continue
            try:
                error = ray.get(ask.remote(), timeout=ASK_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayActorError as err:
                return f"a vLLM server actor died: {str(err).strip().splitlines()[0]}"
            if error:
                return f"vLLM engine failed: {error}"
        return None

    # ------------------------------------------------------------ thread
    def start(self) -> JobWatchdog:
        self._thread = threading.Thread(target=self._run, name="pdm-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.bounds.poll_seconds):
            try:
                reason = self.fault()
            except Exception as err:  # the watchdog must never be what kills a healthy job
                print(
                    f"pdmask watchdog: check failed ({type(err).__name__}: {err})", file=sys.stderr
                )
                continue
            if reason:
                self.on_fault(reason)
                return


def end_job(reason: str) -> None:
    """The TaskRunner's fault action: say why, record it on the run, end the process."""
    from pdmask.backends.verl import tracking

    print(f"pdmask watchdog: ending the job: {reason}", file=sys.stderr, flush=True)
    try:
        tracking.mark_failed(reason, extra_tags={WATCHDOG_TAG: reason})
    except Exception as err:  # an unreachable store must not keep a stalled job alive
        print(f"pdmask watchdog: could not record it in MLflow: {err}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def server_handles(trainer) -> list:
    """The vLLM server actors of verl's trainer (none before verl has created them)."""
    manager = getattr(trainer, "llm_server_manager", None)
    if manager is None:
        return []
    return [server for replica in manager.get_replicas() for server in replica.servers]
