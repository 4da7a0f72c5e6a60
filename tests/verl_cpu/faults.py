"""Faults injected into a running VeRL sweep, each once its trial's first step is in MLflow.

Three kinds, one per trial (by method name), as an operator, a failing machine or an unavailable
tracking server would cause them:

- ``stop``: the trial's Ray job is stopped through Ray's job API;
- ``engine``: the job's vLLM engine core process is SIGKILLed (found in the sweep's process tree
  by the title vLLM gives it, ``VLLM::EngineCore``);
- ``tracking``: the tracking server refuses the run's metric writes (the sweep's tracking URI is
  a ``refusing_proxy.RefusingProxy``) until the faulted attempt has ended: from step 2 on, every
  write of the attempt is refused, however long it trains on.

The sweep runs one trial at a time (``max_concurrent: 1``), so the engine core alive when a
trial's step 1 appears is that trial's. Waits are on events (a logged step, a process
appearing), polled every second; verl checkpoints each step before logging it, so the retry
resumes from step >= 1.
While the sweep's Ray head lives (it goes with the sweep), the injector also records how each
faulted attempt ended (Ray's job status and end time) and where its retry resumed (the
``Resuming from .../global_step_N`` line verl prints).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field

from pdmask.orchestration.cluster.local_head import tree_of

from .refusing_proxy import RefusingProxy

STEP_KEY = "actor/pdm/kl_topk_mean"
ENGINE_TITLE = "EngineCore"


@dataclass
class Injected:
    kind: str
    method: str
    run_id: str
    submission_id: str
    at: float  # time.time() of the injection
    detail: str = ""
    ended_status: str | None = None  # Ray's status of the faulted attempt once it ended
    ended_at: float | None = None  # its end time (time.time() scale)
    resumed_from: int | None = None  # the step the retry resumed from
    run_status_at_end: str | None = None  # the run's status when the faulted attempt ended

    @property
    def retry_id(self) -> str:
        return self.submission_id[: -len("a1")] + "a2"


@dataclass
class FaultInjector:
    """Watches the sweep's runs and injects ``faults`` (method -> kind) once each."""

    sweep_pid: int
    client: object
    experiment: str
    address_of: callable  # () -> the local head's job API address, once the sweep printed it
    faults: dict[str, str]
    proxy: RefusingProxy | None = None  # the sweep's tracking server, for ``tracking``
    injected: list[Injected] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> FaultInjector:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._round()
            except Exception as err:  # reported by the tests, never hidden
                self.errors.append(f"{type(err).__name__}: {err}")

    def _round(self) -> None:
        self._follow_up()
        done = {i.method for i in self.injected}
        todo = {m: k for m, k in self.faults.items() if m not in done}
        if not todo:
            return
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            return
        for run in self.client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
            tags = run.data.tags
            method = tags.get("pdm.method")
            if method not in todo:
                continue
            if tags.get("pdm.attempts") != "1" or not tags.get("pdm.ray_job"):
                continue
            history = self.client.get_metric_history(run.info.run_id, STEP_KEY)
            if not any(m.step >= 1 for m in history):
                continue
            sid = tags["pdm.ray_job"]
            detail = self._inject(todo[method], sid, run.info.run_id)
            self.injected.append(
                Injected(todo[method], method, run.info.run_id, sid, time.time(), detail)
            )

    def _follow_up(self) -> None:
        pending = [i for i in self.injected if i.ended_at is None or i.resumed_from is None]
        if not pending:
            return
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(self.address_of())
        for fault in pending:
            if fault.ended_at is None:
                info = jobs.get_job_info(fault.submission_id)
                if info.end_time:
                    fault.ended_status = str(getattr(info.status, "value", info.status))
                    fault.ended_at = info.end_time / 1000
                    run = self.client.get_run(fault.run_id)
                    fault.run_status_at_end = run.info.status
                    if fault.kind == "tracking":  # the server is back for the retry
                        self.proxy.allow(fault.run_id)
            if fault.resumed_from is None:
                try:
                    logs = jobs.get_job_logs(fault.retry_id)
                except Exception:  # not submitted yet
                    continue
                match = re.search(r"Resuming from \S*global_step_(\d+)", logs)
                if match:
                    fault.resumed_from = int(match.group(1))

    def _inject(self, kind: str, sid: str, run_id: str) -> str:
        if kind == "stop":
            from ray.job_submission import JobSubmissionClient

            assert JobSubmissionClient(self.address_of()).stop_job(sid), f"could not stop {sid}"
            return "stopped through the job API"
        if kind == "engine":
            cores = [p for p in tree_of(self.sweep_pid) if ENGINE_TITLE in _cmdline(p)]
            assert len(cores) == 1, f"expected one vLLM engine core, found {cores}"
            os.kill(cores[0], signal.SIGKILL)
            return f"SIGKILLed the engine core (pid {cores[0]})"
        if kind == "tracking":
            self.proxy.refuse(run_id)
            return f"the tracking server refuses run {run_id}'s metric writes"
        raise ValueError(kind)


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")
    return ""
