"""Run a sweep's trials as Ray Jobs on a cluster: admit, submit or attach, poll, retry, settle.

``Launch.RAY_JOBS`` of the one runner (``runner.run_sweep``, whose shared tail settles, sums up,
draws and sets the exit code). The backend (a ``SubmitsJobs``, e.g. VeRL) builds the jobs
(``JobBatch``); what is not the backend's is here: ids, admission, attempts, runs, logs, faults.
Flow (``pdm sweep NAME --backend verl --address http://HEAD:8265``):

1. Every trial's job is built and checked first (nothing launches on a bad grid), and every trial
   must fit the cluster's nodes. For an ``--address`` (a cluster pdm did not start) settings the
   nodes cannot share are refused and ``pdm cluster check`` runs from every node first
   (``shared_storage``, ``cluster_check``; ``--skip-cluster-check`` skips both). Trials with a
   FINISHED run (by trial hash) are skipped; with none left, no head is started.
2. The cluster's job list is read: a trial whose job is still PENDING/RUNNING (a previous
   invocation was stopped) is *attached*, never submitted twice. Submission ids are deterministic,
   ``pdm-<sweep>-<trial hash>-a<attempt>``, so a second submission of the same attempt is refused by
   Ray, and that refusal also means "attach".
3. Admission: a job is submitted only while its GPUs fit into the cluster's free GPUs, which are
   ``total - max(GPUs in use now, GPUs reserved by this sweep's running jobs)`` (a job that is
   still starting holds its reservation before verl allocates the GPUs). Largest trials go first.
4. Before each submission pdmask pre-creates (or resumes) the trial's one MLflow run with TAGS
   ONLY (verl logs its config as params itself; a conflicting param would silently disable
   MLflow) and passes it as ``MLFLOW_RUN_ID``; a retry attaches to the same run.
5. Polling: a job that FAILED (or was STOPPED) marks its run FAILED with the log's tail as
   ``pdm.failure_reason`` (every attempt's reason is kept in ``pdm.failures``), and is retried
   ``sweep.retries`` times; a job that SUCCEEDED whose run is not FINISHED is settled: FINISHED
   (tagged ``pdm.finished_by``) when the run has metrics, else a failed attempt.
   Every ended job's driver log (Jobs API) is appended to the trial's log in the state folder
   and logged as its run's artifact (``trial_logs.py``).
6. Ctrl-C, SIGTERM and SIGHUP detach (exit 130): the jobs keep running on the cluster, their
   runs RUNNING (the summary counts them); the same command attaches again. A job API that does not answer is retried, a line per round, for
   ``PDM_CLUSTER_UNREACHABLE_SECONDS`` (180 s); then the sweep ends (``ClusterLost``, exit 1)
   with the command that resumes it.

On a CPU cluster profile (``this-machine``) with no ``--address`` pdmask starts a Ray head on this
machine's loopback for the sweep and stops it at the end (``ray_jobs_local``): the jobs are then
stopped with it, their runs settled KILLED, and the next invocation resumes them from their
checkpoints.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from rich.markup import escape

from pdmask.backends.interface import JobBatch, load_backend, submission_id
from pdmask.console import table
from pdmask.errors import ClusterLost, ConfigError, ValidationFailed
from pdmask.orchestration.jobs.checks import (
    UNREACHABLE_ENV,
    UNREACHABLE_SECONDS,
    check_fit,
    poll_seconds,
    require_cluster_check,
    unreachable_seconds,
    unshared,
)
from pdmask.orchestration.jobs.cluster import (
    ClusterUnreachable,
    JobCluster,
    JobView,
    headline,
)
from pdmask.orchestration.runner import SweepOutcome, settle, unfinished
from pdmask.registry import CLUSTERS, Trial
from pdmask.tracking import TrialRun, runs_by_hash
from pdmask.tracking.runs import take_watchdog_reason, with_retry
from pdmask.tracking.store import redact

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
    state: str = "queued"  # queued -> active -> finished | failed (or queued again to retry)
    reason: str = ""


def run_jobs(session) -> SweepOutcome:
    """``Launch.RAY_JOBS``: every unfinished trial of the session's sweep as a Ray job, settled
    by the runner's shared tail (``runner.settle``)."""
    sweep, trials, options, console = (
        session.sweep,
        session.trials,
        session.options,
        session.console,
    )
    address = options.address or os.environ.get("RAY_ADDRESS")
    cluster_name = options.cluster or sweep.cluster
    on_this_machine = CLUSTERS[cluster_name].device == "cpu"
    backend_name = trials[0].backend if trials else sweep.backend
    if not address and not on_this_machine:
        raise ConfigError(
            f"--backend {backend_name} submits Ray Jobs to a cluster: give --address "
            "http://HEAD:8265 (or set RAY_ADDRESS); only a CPU profile (this-machine) starts a "
            "Ray head here"
        )
    if sweep.search is not None:
        raise ConfigError(
            f"sweep {sweep.name} is a search: searches run on the embedded backend; on "
            f"{backend_name}, list the points as a grid"
        )
    for bound in (poll_seconds, unreachable_seconds):  # refused before any job or head
        bound()
    batch = load_backend(backend_name).job_batch(
        session.reg, sweep, trials, cluster=cluster_name, tracking_uri=session.uri
    )
    # An address is a cluster pdm did not start here: what its nodes cannot share is refused.
    prove = bool(address) and not options.skip_cluster_check
    problems = (unshared(session.uri, batch) if prove else []) + batch.problems
    if problems:  # every one at once, before anything launches
        raise ValidationFailed(problems)
    todo, done = unfinished(runs_by_hash(session.client, session.experiment_id), trials)
    if not todo:  # nothing to submit: no head to start, no cluster to check
        console.print(
            f"sweep {sweep.name}: {len(trials)} trials, {len(done)} already finished, 0 to run "
            f"(tracking: {redact(session.uri)})"
        )
        return _settled(session, cluster_name, done, detached=set())
    batch.prepare(log=console.print)
    if prove:  # from every node, before the first submission (`pdm cluster check`)
        require_cluster_check(address, session.uri, batch, console)
    if address:
        return _run_on(session, address, cluster_name, batch)
    from pdmask.orchestration.cluster.local_head import LocalRayHead

    head = LocalRayHead(
        num_gpus=CLUSTERS[cluster_name].gpus, log=console.print, scratch_env=batch.scratch_env
    )
    with head:
        session.interrupts.install()  # the head took SIGTERM and SIGHUP over while it started
        return _run_on(session, head.address, cluster_name, batch, local_head=True)


def _settled(session, cluster_name: str, done: set[str], detached: set[str]) -> SweepOutcome:
    """The runner's shared settling of the session's trials (``detached``: their jobs run on)."""
    trials = session.trials
    return settle(
        session.client,
        session.experiment_id,
        session.sweep,
        trials,
        len(done),
        session.console,
        load_backend(trials[0].backend).eval_metrics(cluster_name) if trials else [],
        started=session.started,
        detached=detached,
    )


def _run_on(
    session, address: str, cluster_name: str, batch: JobBatch, local_head: bool = False
) -> SweepOutcome:
    """The sweep's jobs on the Ray cluster at ``address`` (``local_head``: one pdm started)."""
    sweep, trials, console = session.sweep, session.trials, session.console
    unreachable_s = unreachable_seconds()
    cluster = JobCluster(address)
    try:
        node_gpus = cluster.node_gpus()
    except ConnectionError as err:
        raise ConfigError(f"--address {address}: {err}") from None
    check_fit(trials, batch, node_gpus, cluster_name)
    todo_trials, done = unfinished(runs_by_hash(session.client, session.experiment_id), trials)
    jobs = {
        t.trial_hash: TrialJob(t, batch.resources(t)["gpus"], tries_left=1 + sweep.retries)
        for t in trials
    }
    todo = [jobs[t.trial_hash] for t in todo_trials]
    console.print(
        f"sweep {sweep.name}: {len(jobs)} trials, {len(jobs) - len(todo)} already finished, "
        f"{len(todo)} to run as Ray jobs on {cluster.address} (tracking: {redact(session.uri)})"
    )
    runner = JobRunner(
        sweep=sweep,
        cluster=cluster,
        batch=batch,
        client=session.client,
        uri=session.uri,
        experiment_id=session.experiment_id,
        tags=session.tags,
        console=console,
        max_concurrent=session.options.max_concurrent or sweep.max_concurrent,
        stop=session.interrupts.event,  # SIGINT, SIGTERM, SIGHUP: return at the next round
        unreachable_s=unreachable_s,
        resume_command=session.options.command(sweep.name),
    )
    runner.adopt(todo)
    lost = None
    try:
        runner.run(todo)
    except ClusterLost as err:
        lost = str(err)
    _jobs_table(console, sweep, list(jobs.values()), done)
    active = [j for j in todo if j.state == "active"]
    # Jobs that run on after this invocation keep their runs RUNNING: the same command attaches.
    # A local head's jobs stop with it: their runs are settled as interrupted, resumed next time.
    detached = set() if local_head else {j.trial.trial_hash for j in active}
    outcome = _settled(session, cluster_name, done, detached)
    outcome.lost_cluster = lost
    ids = ", ".join(j.sid for j in active)
    outcome.resume_note = (
        f"interrupted: {len(active)} job(s) stop with the local Ray head ({ids}); the same "
        "command resumes them from their checkpoints"
        if local_head
        else f"detached: {len(active)} job(s) keep running on the cluster ({ids}); the same "
        "command attaches to them"
    )
    return outcome


@dataclass
class JobRunner:
    """Admission, submission, polling and settling of one sweep's trial jobs."""

    sweep: object
    cluster: JobCluster
    batch: JobBatch  # the backend's jobs: each attempt's spec
    client: object
    uri: str
    experiment_id: str
    tags: dict[str, str]
    console: object
    max_concurrent: int | None = None
    # Set by a signal (``interrupts.handled``): the runner returns at its next round.
    stop: threading.Event = field(default_factory=threading.Event)
    unreachable_s: float = UNREACHABLE_SECONDS  # how long the job API may be silent
    resume_command: str = "the same command"  # what to run once the cluster is back
    _waiting_note: str = ""
    _down_since: float | None = None  # when the job API last stopped answering

    # ------------------------------------------------------------ start-up
    def adopt(self, todo: list[TrialJob]) -> None:
        """Attach to this sweep's jobs already on the cluster (active, or ended unrecorded)."""
        existing = self.cluster.pdm_jobs(self.sweep.name)
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
        runs = runs_by_hash(self.client, self.experiment_id).get(trial.trial_hash, [])
        return runs[0].info.run_id if runs else None

    # ------------------------------------------------------------ main loop
    def run(self, todo: list[TrialJob]) -> None:
        """Poll and admit until every job ended or a stop was requested (``self.stop``)."""
        poll = poll_seconds()
        while any(j.state in ("queued", "active") for j in todo) and not self.stop.is_set():
            try:
                for job in todo:
                    if job.state == "active":
                        self._poll(job)
                self._admit(todo)
            except ClusterUnreachable as err:  # a dashboard restart, a network blip, a lost head
                self._unreachable(err, poll)
            else:
                self._down_since = None
            if any(j.state in ("queued", "active") for j in todo):
                self.stop.wait(poll)

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
                f"again, `{self.resume_command}` attaches to the jobs still running and resumes "
                "the others from their checkpoints"
            )
        self.console.print(
            f"[yellow]the Ray job API at {self.cluster.address} does not answer "
            f"({escape(detail)}); retrying every {poll:g} s, giving up in "
            f"{self.unreachable_s - silent:.0f} s[/yellow]"
        )

    def _poll(self, job: TrialJob) -> None:
        view = self.cluster.view(job.sid)  # ClusterUnreachable: ``run`` retries within its bound
        if view is None:  # deleted from the cluster (`ray job delete`)
            self._fail(job, f"Ray job {job.sid} disappeared from the cluster")
        elif not view.active:
            self._settle(job, view)

    def _admit(self, todo: list[TrialJob]) -> None:
        active = [j for j in todo if j.state == "active"]
        queued = sorted((j for j in todo if j.state == "queued"), key=lambda j: -j.gpus)
        if not queued:
            return
        total = sum(self.cluster.node_gpus())
        reserved = sum(j.gpus for j in active)
        # Ray can count a dead node's job as holding GPUs a while after the node left the total
        free = max(0.0, total - max(self.cluster.gpus_in_use(), reserved))
        admitted = 0
        for job in queued:
            if self.max_concurrent and len(active) + admitted >= self.max_concurrent:
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
            self.client, self.experiment_id, job.trial, self.tags, log_params=False
        )
        if run is None:  # another invocation finished it meanwhile
            job.state = "finished"
            return
        attempt = max(job.attempts, default=0) + 1
        spec = self.batch.spec(job.trial, run_id=run.run_id, attempt=attempt)
        sid = spec["submission_id"]
        res = spec["resources"]
        for key, value in {
            "pdm.ray_job": sid,
            "pdm.ray_address": self.cluster.address,
            "pdm.verl.resources": f"{res['nodes']}x{res['gpus_per_node']} {res['gpu_kind']}",
        }.items():
            with_retry(lambda k=key, v=value: self.client.set_tag(run.run_id, k, v))
        job.attempts.add(attempt)
        job.tries_left -= 1
        job.sid, job.run_id, job.state = sid, run.run_id, "active"
        metadata = {
            "pdm.sweep": self.sweep.name,
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
            f"{verb} {sid} ({res['gpus']} GPUs, attempt {attempt}): {job.trial.run_name()}"
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
            problem = self._settle_success(run_id)
            if problem is None:
                job.state = "finished"
                self.console.print(f"FINISHED {job.trial.run_name()} ({view.submission_id})")
                return
            self._fail(job, f"Ray job {view.submission_id} SUCCEEDED, but {problem}")
        else:
            reason = self.cluster.failure_reason(view, log)
            cause = take_watchdog_reason(self.client, run_id)
            cause = cause and f"the job's watchdog: {cause}"
            self._fail(job, f"{cause}\n{reason}" if cause else reason)

    def _keep_log(self, job: TrialJob, view: JobView) -> str | None:
        """The ended job's driver log, returned, appended to the trial's log in the state folder
        and logged as its run's artifact (``trial_logs``), best effort."""
        from pdmask.orchestration import trial_logs

        if self.cluster is None:  # settling from MLflow alone (no cluster to ask)
            return None
        text = self.cluster.driver_log(view.submission_id)
        if text is None:
            return None
        trial = job.trial
        attempt = view.submission_id.rsplit("-a", 1)[-1]
        source = f"Ray job {view.submission_id} {view.status}, fetched {time.strftime('%Y-%m-%dT%H:%M:%S')}"
        first = trial_logs.header(
            trial.run_name(), trial.trial_hash, job.run_id or "unknown", attempt, source
        )
        try:
            path = trial_logs.append(
                trial_logs.log_path(self.sweep.name, trial.run_name()), first, text
            )
        except OSError as err:
            self.console.print(
                f"[yellow]could not keep the log of {view.submission_id}: {err}[/yellow]"
            )
            return text
        if job.run_id:
            trial_logs.upload(self.client, job.run_id, path)
        return text

    def _settle_success(self, run_id: str | None) -> str | None:
        """None when the run is (now) FINISHED; otherwise what is wrong with it."""
        if run_id is None:
            return "no MLflow run is known for it"
        run = with_retry(lambda: self.client.get_run(run_id))
        status = run.info.status
        if status == "FINISHED":
            return None
        if status == "RUNNING" and run.data.metrics:
            # verl ended without closing the run (e.g. killed after its last step was logged)
            with_retry(
                lambda: self.client.set_tag(
                    run_id, FINISHED_BY_TAG, "pdm: job SUCCEEDED, run left RUNNING"
                )
            )
            with_retry(lambda: self.client.set_terminated(run_id, status="FINISHED"))
            return None
        if status == "RUNNING":
            return (
                "its MLflow run has no metrics: verl's MLflow logging did not reach the run "
                "(unreachable tracking URI from the nodes, or a param conflict disabling it)"
            )
        reason = run.data.tags.get("pdm.failure_reason", "")
        return f"its MLflow run ended {status}" + (f": {reason}" if reason else "")

    def _fail(self, job: TrialJob, reason: str) -> None:
        """A failed attempt; the console shows the reason's first line (the watchdog's reason, or
        the job's status and Ray's message), never a log tail's last line."""
        if job.run_id:
            TrialRun(self.client, job.run_id, -1, 0, True).fail(reason, final=True)
        job.reason = reason
        last = headline(reason)
        if job.tries_left > 0:
            job.state = "queued"
            self.console.print(
                f"FAILED {job.sid}: {last[:160]} -- retrying ({job.tries_left} retr"
                f"{'y' if job.tries_left == 1 else 'ies'} left)"
            )
        else:
            job.state = "failed"
            self.console.print(f"FAILED {job.sid}: {last[:160]} -- no retries left")


def _jobs_table(console, sweep, jobs: list[TrialJob], done: set[str]) -> None:
    """Each trial's attempts as Ray jobs, its state in this invocation and its last error."""
    rows = []
    for job in jobs:
        status = "skipped (finished before)" if job.trial.trial_hash in done else job.state
        reason = headline(job.reason)[:120] if job.state == "failed" else ""
        ids = ", ".join(
            submission_id(sweep.name, job.trial.trial_hash, a).rsplit("-", 1)[1]
            for a in sorted(job.attempts)
        )
        rows.append([job.trial.run_name(), job.trial.trial_hash[:10], ids, status, reason])
    console.print(
        table(
            f"sweep {sweep.name}: Ray jobs",
            ["trial", "hash", "attempts", "status", "last error"],
            rows,
            wrap={"last error"},
        )
    )
