"""The job loop: one session's trials as Ray jobs, admitted, submitted or attached, polled,
retried and settled (``launcher.JobsLauncher`` runs it; its docstring has the flow).

What is not the backend's is here: submission ids, admission by free GPUs, attempts, the runs
each job logs into, the jobs' logs, and their faults. A job that FAILED (or was STOPPED) marks its
run FAILED with the log's tail as ``pdm.failure_reason`` (every attempt's reason is kept in
``pdm.failures``) and is retried ``sweep.retries`` times; a job that SUCCEEDED is FINISHED only
with a complete run (``tracking/completeness.py``: its planned last step and validations; a run
left RUNNING is then closed, tagged ``pdm.finished_by``), else a failed attempt naming the gap.
Every job's driver log (Jobs API) is copied into the trial's log in the state folder as the job
runs and whole when it ends, then logged as its run's artifact (``job_logs.py``). A job API that does not answer
is retried, a line per round, for ``PDM_CLUSTER_UNREACHABLE_SECONDS``; then ``ClusterLost``. Each
round ends with the progress line when it is due (``progress.py``: counts, elapsed, ETA).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.markup import escape

from pdmask.backends.interface import JobBatch
from pdmask.errors import ClusterLost
from pdmask.orchestration.jobs.checks import UNREACHABLE_ENV, UNREACHABLE_SECONDS, poll_seconds
from pdmask.orchestration.jobs.cluster import ClusterUnreachable, JobCluster, JobView, failure_kind
from pdmask.orchestration.jobs.job_logs import JobLogs
from pdmask.orchestration.jobs.progress import JobsProgress
from pdmask.orchestration.session import SweepSession
from pdmask.registry import Trial
from pdmask.tracking import TrialRun, runs_by_hash
from pdmask.tracking.runs import FailureKind, failure_headline, take_watchdog_reason, with_retry
from pdmask.tracking.step_times import resources_tag

FINISHED_BY_TAG = "pdm.finished_by"


@dataclass
class TrialJob:
    """One trial's life on the cluster during this invocation."""

    trial: Trial
    gpus: int
    tries_left: int
    attempts: set[int] = field(default_factory=set)  # every attempt number seen on the cluster
    sid: str | None = None  # the current attempt's submission id
    run_id: str | None = None
    # queued -> active -> finished | failed (or queued again to retry); stopped: its setting was
    # stopped before it was submitted
    state: str = "queued"
    reason: str = ""


@dataclass
class JobRunner:
    """Admission, submission, polling and settling of one session's trial jobs on ``cluster``.
    A stop requested on the session (a signal: ``interrupts.handled``) returns at the next
    round."""

    session: SweepSession
    cluster: JobCluster
    batch: JobBatch  # the backend's jobs: each attempt's spec
    unreachable_s: float = UNREACHABLE_SECONDS  # how long the job API may be silent
    progress: JobsProgress | None = None  # the progress line as it polls (None: none)
    _waiting_note: str = ""
    _down_since: float | None = None  # when the job API last stopped answering
    _logs: JobLogs | None = None  # the jobs' driver logs, followed (made at the first poll)

    @property
    def client(self):
        return self.session.client

    @property
    def console(self):
        return self.session.console

    # ------------------------------------------------------------ start-up
    def adopt(self, todo: list[TrialJob]) -> None:
        """Attach to this sweep's jobs already on the cluster (active, or ended unrecorded)."""
        existing = self.cluster.pdm_jobs(self.session.sweep.name)
        for job in todo:
            attempts = existing.get(job.trial.trial_hash, {})
            job.attempts = set(attempts)
            if not attempts:
                continue
            latest = attempts[max(attempts)]
            if latest.active or self._unrecorded(latest):
                job.sid, job.state, job.tries_left = (
                    latest.submission_id,
                    "active",
                    job.tries_left - 1,
                )
                job.run_id = latest.run_id or self._run_id_of(job.trial)
                self.session.gate.start(job.trial)  # running: never held back or left out
                self.console.print(
                    f"attached to {latest.submission_id} ({latest.status}): {job.trial.run_name()}"
                )

    def _unrecorded(self, view: JobView) -> bool:
        """An ended job whose run still says RUNNING: nobody recorded how it ended."""
        if view.run_id is None:
            return False
        try:
            run = with_retry(lambda: self.client.get_run(view.run_id))
        except Exception:
            return False
        return run.info.status == "RUNNING"

    def _run_id_of(self, trial: Trial) -> str | None:
        runs = runs_by_hash(self.client, self.session.experiment_id).get(trial.trial_hash, [])
        return runs[0].info.run_id if runs else None

    # ------------------------------------------------------------ main loop
    def run(self, todo: list[TrialJob]) -> None:
        """Poll and admit until every job ended or a stop was requested on the session."""
        poll, stop = poll_seconds(), self.session.interrupts.event
        while any(j.state in ("queued", "active") for j in todo) and not stop.is_set():
            try:
                for job in todo:
                    if job.state == "active":
                        self._poll(job)
                self._admit(todo)
            except ClusterUnreachable as err:  # a dashboard restart, a network blip, a lost head
                self._unreachable(err, poll)
            else:
                self._down_since = None
            if self.progress is not None:
                self.progress.tick(todo)
            if any(j.state in ("queued", "active") for j in todo):
                stop.wait(poll)

    def _unreachable(self, err: ClusterUnreachable, poll: float) -> None:
        """One line per retry; ``ClusterLost`` once the job API has been silent for the bound."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        silent = now - self._down_since
        detail = " ".join(str(err).split())[:300]  # one line, however the HTTP library put it
        if silent >= self.unreachable_s:
            raise ClusterLost(
                f"the Ray job API at {self.cluster.address} has not answered for {silent:.0f} s "
                f"(the bound, {UNREACHABLE_ENV}, is {self.unreachable_s:g} s; last error: "
                f"{detail}). The trials' runs and checkpoints are kept: once the cluster answers "
                f"again, `{self.session.options.command(self.session.sweep.name)}` attaches to the "
                "jobs still running and resumes the others from their checkpoints"
            )
        self.console.print(
            f"[yellow]the Ray job API at {self.cluster.address} does not answer "
            f"({escape(detail)}); retrying every {poll:g} s, giving up in "
            f"{self.unreachable_s - silent:.0f} s[/yellow]"
        )

    def _poll(self, job: TrialJob) -> None:
        view = self.cluster.view(job.sid)  # ClusterUnreachable: ``run`` retries within its bound
        if view is None:  # deleted from the cluster (`ray job delete`)
            reason = f"Ray job {job.sid} disappeared from the cluster"
            self._fail(job, reason, FailureKind.LOST_NODE)
        elif not view.active:
            self._settle(job, view)
        else:
            try:
                self.logs.follow(job.trial, job.sid, view.run_id or job.run_id)
            except OSError as err:  # a copy: the trial goes on; the end's copy tries again
                self.console.print(f"[yellow]could not copy the log of {job.sid}: {err}[/yellow]")

    @property
    def logs(self) -> JobLogs:
        if self._logs is None:
            self._logs = JobLogs(self.cluster, self.session.sweep.name)
        return self._logs

    def _admit(self, todo: list[TrialJob]) -> None:
        """Submit the queued jobs the gate admits (every setting's canary first, largest first)
        while their GPUs fit; a stopped setting's queued jobs are never submitted."""
        gate = self.session.gate
        gate.refresh()
        for job in todo:
            if job.state == "queued" and gate.is_stopped(job.trial):
                job.state = "stopped"
        active = [j for j in todo if j.state == "active"]
        queued = sorted(
            (j for j in todo if j.state == "queued" and gate.admissible(j.trial)),
            key=lambda j: (not gate.is_canary(j.trial), -j.gpus),
        )
        if not queued:
            return
        total = sum(self.cluster.node_gpus())
        reserved = sum(j.gpus for j in active)
        # Ray can count a dead node's job as holding GPUs a while after the node left the total
        free = max(0.0, total - max(self.cluster.gpus_in_use(), reserved))
        admitted = 0
        for job in queued:
            if (
                self.session.max_concurrent
                and len(active) + admitted >= self.session.max_concurrent
            ):
                break
            if job.gpus <= free:
                self._submit(job)
                if job.state == "active":
                    free -= job.gpus
                    admitted += 1
        waiting = [j for j in queued if j.state == "queued"]
        note = (
            f"{len(waiting)} trial(s) waiting for GPUs ({free:g} of {total:g} free)"
            if waiting
            else ""
        )
        if note and note != self._waiting_note:
            self.console.print(note)
        self._waiting_note = note

    def _submit(self, job: TrialJob) -> None:
        run = TrialRun.start_or_resume(
            self.client,
            self.session.experiment_id,
            job.trial,
            self.session.tags,
            steps=self.session.planned_steps(job.trial),
        )
        if run is None:  # another invocation finished it meanwhile
            job.state = "finished"
            self.session.gate.end(job.trial.trial_hash)
            return
        attempt = max(job.attempts, default=0) + 1
        spec = self.batch.spec(job.trial, run_id=run.run_id, attempt=attempt)
        sid, res = spec.submission_id, spec.resources
        for key, value in {
            "pdm.ray_job": sid,
            "pdm.ray_address": self.cluster.address,
            "pdm.verl.resources": resources_tag(res.nodes, res.gpus_per_node, res.gpu_kind),
        }.items():
            with_retry(lambda k=key, v=value: self.client.set_tag(run.run_id, k, v))
        job.attempts.add(attempt)
        job.tries_left -= 1
        job.sid, job.run_id, job.state = sid, run.run_id, "active"
        if self.progress is not None:
            self.progress.submitted(job.trial.trial_hash)
        self.session.gate.start(job.trial)
        metadata = {
            "pdm.sweep": self.session.sweep.name,
            "pdm.trial_hash": job.trial.trial_hash,
            "pdm.run_id": run.run_id,
            "pdm.run_name": job.trial.run_name(),
        }
        try:
            attached = self.cluster.submit(spec, metadata)
        except Exception as err:  # the cluster refused it: a failed attempt like any other
            self._fail(job, f"submitting Ray job {sid} failed: {type(err).__name__}: {err}")
            return
        if attached:
            self._adopt_their_run(job, run)
        verb = "attached to already submitted" if attached else "submitted"
        self.console.print(
            f"{verb} {sid} ({res.gpus} GPUs, attempt {attempt}): {job.trial.run_name()}"
        )

    def _adopt_their_run(self, job: TrialJob, ours: TrialRun) -> None:
        """Another invocation submitted this very attempt between our look and our submission:
        its job logs into its run. A run we created for the attempt is deleted, so the trial
        keeps one run and none is left RUNNING with no job."""
        try:
            theirs = self.cluster.view(job.sid)
        except ClusterUnreachable:
            return  # the next poll settles the job; its run id comes with the view
        if theirs is None or not theirs.run_id or theirs.run_id == ours.run_id:
            return
        if not ours.resumed:
            with_retry(lambda: self.client.delete_run(ours.run_id))
        job.run_id = theirs.run_id
        self.console.print(f"{job.sid} was submitted by another invocation: using its run")

    # ------------------------------------------------------------ outcomes
    def _settle(self, job: TrialJob, view: JobView) -> None:
        run_id = view.run_id or job.run_id
        job.run_id = run_id
        log = self._keep_log(job, view)
        if view.status == "SUCCEEDED":
            problem = self._settle_success(job)
            if problem is None:
                job.state = "finished"
                self.console.print(f"FINISHED {job.trial.run_name()} ({view.submission_id})")
                self.session.gate.end(job.trial.trial_hash)
                return
            what, kind = problem
            self._fail(job, f"Ray job {view.submission_id} SUCCEEDED, but {what}", kind)
        else:
            reason = self.cluster.failure_reason(view, log)
            kind = failure_kind(view, log)
            cause = take_watchdog_reason(self.client, run_id)
            if cause:  # a stall or a dead engine the watchdog found first (unless it never started)
                reason = f"the job's watchdog: {cause}\n{reason}"
                kind = kind if kind.deterministic else FailureKind.STALL
            self._fail(job, reason, kind)

    def _keep_log(self, job: TrialJob, view: JobView) -> str | None:
        """The ended job's driver log, returned, its rest copied into the trial's log in the
        state folder and the file logged as its run's artifact (``job_logs``), best effort."""
        from pdmask.orchestration import trial_logs

        if self.cluster is None:  # settling from MLflow alone (no cluster to ask)
            return None
        text = self.cluster.driver_log(view.submission_id)
        try:
            path = self.logs.finish(job.trial, view, job.run_id, text)
        except OSError as err:
            self.console.print(
                f"[yellow]could not keep the log of {view.submission_id}: {err}[/yellow]"
            )
            return text
        if job.run_id and path is not None:
            trial_logs.upload(self.client, job.run_id, path)
        return text

    def _settle_success(self, job: TrialJob) -> tuple[str, FailureKind] | None:
        """None when the job's run is (now) FINISHED and complete (``completeness``); otherwise
        what is wrong with it and the failure's kind. verl closes its run FINISHED whatever it
        logged, so a FINISHED run is checked too."""
        from pdmask.backends.interface import load_backend
        from pdmask.tracking.completeness import Plan, gap

        run_id = job.run_id
        if run_id is None:
            return "no MLflow run is known for it", FailureKind.CRASH
        run = with_retry(lambda: self.client.get_run(run_id))
        status = run.info.status
        if status not in ("FINISHED", "RUNNING"):
            reason = run.data.tags.get("pdm.failure_reason", "")
            return f"its MLflow run ended {status}" + (f": {reason}" if reason else ""), (
                FailureKind.CRASH
            )
        if status == "RUNNING" and not run.data.metrics:
            return (
                "its MLflow run has no metrics: verl's MLflow logging did not reach the run "
                "(unreachable tracking URI from the nodes, or a param conflict disabling it)"
            ), FailureKind.CRASH
        backend = load_backend(job.trial.backend)
        plan = Plan.of(backend.planned_steps(job.trial), backend.eval_metrics(self.session.cluster))
        missing = gap(self.client, run_id, plan)
        if missing:
            return f"its MLflow run is incomplete: {missing}", FailureKind.INCOMPLETE
        if status == "RUNNING":
            # verl ended without closing the run (e.g. killed after its last step was logged)
            with_retry(
                lambda: self.client.set_tag(
                    run_id, FINISHED_BY_TAG, "pdm: job SUCCEEDED, run left RUNNING"
                )
            )
            with_retry(lambda: self.client.set_terminated(run_id, status="FINISHED"))
        return None

    def _fail(self, job: TrialJob, reason: str, kind: FailureKind = FailureKind.CRASH) -> None:
        """A failed attempt of ``kind``, recorded on its run (a crash alike an earlier attempt's
        is recorded REPEATED); a deterministic one is not retried. The console shows the line
        that names the error (the watchdog's reason, or the job log's last exception), never a
        log tail's last line."""
        if job.run_id:
            kind = TrialRun(self.client, job.run_id, -1, 0, True).fail(reason, True, kind)
        job.reason = reason
        last = failure_headline(reason)
        if job.tries_left > 0 and not kind.deterministic:
            job.state = "queued"
            self.console.print(
                f"FAILED {job.sid}: {last[:160]} -- retrying ({job.tries_left} retr"
                f"{'y' if job.tries_left == 1 else 'ies'} left)"
            )
            return
        job.state = "failed"
        if job.tries_left > 0:
            self.console.print(f"FAILED {job.sid}: {last[:160]} -- not retried ({kind})")
        else:
            self.console.print(f"FAILED {job.sid}: {last[:160]} -- no retries left")
        self.session.gate.end(job.trial.trial_hash)
