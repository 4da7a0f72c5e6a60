"""A VeRL job whose vLLM engine dies, or that stops making progress, ends within a bound.

verl 0.9.1 has no timeout on its weight sync: the trainer sends buckets to vLLM's workers over ZMQ
and waits for each acknowledgement. When a vLLM worker raises during the sync, or the engine core
dies, nothing acknowledges; the job's actors stay alive and idle and the job never ends. Days of a
cluster's GPUs can go that way, and CI's time limit in minutes.

The job runs pdmask's watchdog (``pdmask/watchdog.py``: the stall and start-up bounds, the fault
action) in the TaskRunner, the process that drives verl's trainer loop (``trainer.PDMTrainerSync``
beats it at each finished step and validation), with one probe: every ``poll_seconds`` it asks
each of the job's vLLM servers (``vllm_server.TopKvLLMHttpServer.engine_error``) whether its
engine lives; a dead engine, or a server actor that is gone, is a fault at once.

On a fault the run is FAILED with the reason in ``pdm.failure_reason`` and ``pdm.watchdog`` (the
sweep's job loop puts the latter first in the attempt's failure reason) and the TaskRunner's
process exits, which makes verl's driver raise and the Ray job end FAILED; the sweep then retries
it from its last checkpoint like any failed attempt. It works the same whether or not a
``pdm sweep`` is attached. The bounds reach the job as ``WATCHDOG_ENV`` (set by the job builder
from the cluster profile and the model's step time, ``jobs.watchdog_bounds``); a job without them
runs unwatched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pdmask.watchdog import WATCHDOG_TAG, Bounds, Watchdog, end_process

ASK_TIMEOUT_S = (
    30.0  # a server that cannot answer this long is busy, not dead: the stall bound decides
)


class JobWatchdog(Watchdog):
    """The watchdog of one VeRL job: stalls, and its vLLM servers' engines (see the module)."""

    def __init__(
        self,
        bounds: Bounds,
        servers: Callable[[], Iterable],
        on_fault: Callable[[str], None],
        **kwargs,
    ):
        super().__init__(bounds, on_fault, probe=self._dead_engine, **kwargs)
        self.servers = servers  # the job's vLLM server actors (empty until verl has made them)

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


def end_job(reason: str) -> None:
    """The TaskRunner's fault action: say why, record it on the run, end the process."""
    from pdmask.backends.verl import tracking

    end_process(reason, lambda why: tracking.mark_failed(why, extra_tags={WATCHDOG_TAG: why}))


def server_handles(trainer) -> list:
    """The vLLM server actors of verl's trainer (none before verl has created them)."""
    manager = getattr(trainer, "llm_server_manager", None)
    if manager is None:
        return []
    return [server for replica in manager.get_replicas() for server in replica.servers]
