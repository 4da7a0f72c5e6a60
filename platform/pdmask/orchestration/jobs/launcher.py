"""``Launch.RAY_JOBS``: a sweep's trials as Ray Jobs on a cluster, admitted by free GPUs.

The backend (a ``SubmitsJobs``, e.g. VeRL) builds the jobs (``JobBatch``); what is not the
backend's is pdmask's job loop (``job_loop.JobRunner``): ids, admission, attempts, runs, logs,
faults. Flow (``pdm sweep NAME --backend verl --address http://HEAD:8265``):

1. ``check``, before skip-finished: every trial's job is built and checked (nothing launches on a
   bad grid). For an ``--address`` (a cluster pdm did not start) the settings the nodes cannot
   share are refused too (``cluster.shared_storage``; ``--skip-cluster-check`` skips it).
2. ``launch``, with trials to run: what the jobs read that this machine makes is prepared; for an
   ``--address`` ``pdm cluster check`` runs from every node first (``cluster.check``); on a CPU
   cluster profile (``this-machine``) with no ``--address`` a Ray head is started on this
   machine's loopback (``cluster.local_head``), held by the session until the runs are settled:
   its jobs stop with it, their runs settled KILLED, and the next invocation resumes them from
   their checkpoints. Every trial must fit the cluster's nodes.
3. The cluster's job list is read: a trial whose job is still PENDING/RUNNING (a previous
   invocation was stopped) is *attached*, never submitted twice. Submission ids are deterministic,
   ``pdm-<sweep>-<trial hash>-a<attempt>``, so a second submission of the same attempt is refused
   by Ray, and that refusal also means "attach".
4. Admission: a job is submitted only while its GPUs fit into the cluster's free GPUs, which are
   ``total - max(GPUs in use now, GPUs reserved by this sweep's running jobs)`` (a job that is
   still starting holds its reservation before verl allocates the GPUs). The session's gate says
   which queued trials may go (``canary.py``): every setting's canary first, largest first; a
   setting's other trials once its canary reported its first training step and a validation; none
   of a setting a deterministic failure stopped (such a failure is never retried).
5. Before each submission pdmask pre-creates (or resumes) the trial's one MLflow run with its
   tags and pdmask's params (``tracking.runs.run_params``: the values it trains with, ``steps``
   included) and passes it as ``MLFLOW_RUN_ID``; a retry attaches to the same run. pdmask's
   params have no ``/`` in their names and verl's are ``/``-separated paths into its config
   (every top-level key of which is a section), so none conflicts: a conflicting param would
   silently disable MLflow in verl. Polling, retries and settling each job: ``job_loop.py``.
6. Ctrl-C, SIGTERM and SIGHUP detach (exit 130): the jobs keep running on the cluster, their
   runs RUNNING (the summary counts them); the same command attaches again. A job API that does
   not answer ends the sweep after ``PDM_CLUSTER_UNREACHABLE_SECONDS`` (``ClusterLost``, exit 1)
   with the command that resumes it.
"""

from __future__ import annotations

import os
import time

from pdmask.backends.interface import JobBatch, load_backend, submission_id
from pdmask.console import table
from pdmask.errors import ClusterLost, ConfigError, ValidationFailed
from pdmask.orchestration.eta import Capacity
from pdmask.orchestration.jobs.checks import (
    check_fit,
    poll_seconds,
    require_cluster_check,
    unreachable_seconds,
    unshared,
)
from pdmask.orchestration.jobs.cluster import JobCluster
from pdmask.orchestration.jobs.job_loop import JobRunner, TrialJob
from pdmask.orchestration.jobs.progress import JobsProgress
from pdmask.orchestration.launcher import Launched
from pdmask.orchestration.session import SweepSession, Todo
from pdmask.orchestration.trial_prices import planned
from pdmask.registry import CLUSTERS, Trial
from pdmask.tracking.runs import failure_headline


class JobsLauncher:
    """The ``Launcher`` of ``Launch.RAY_JOBS``; ``check`` builds the jobs ``launch`` submits."""

    def __init__(self) -> None:
        self.address: str | None = None  # the cluster's job API; None: a head started here
        self.batch: JobBatch | None = None
        self.prove = False  # the nodes of ``address`` must prove what they share

    def check(self, session: SweepSession) -> None:
        sweep, options = session.sweep, session.options
        self.address = options.address or os.environ.get("RAY_ADDRESS")
        backend = session.backend.name
        if not self.address and CLUSTERS[session.cluster].device != "cpu":
            raise ConfigError(
                f"--backend {backend} submits Ray Jobs to a cluster: give --address "
                "http://HEAD:8265 (or set RAY_ADDRESS); only a CPU profile (this-machine) starts a "
                "Ray head here"
            )
        if sweep.search is not None:
            raise ConfigError(
                f"sweep {sweep.name} is a search: searches run on the embedded backend; on "
                f"{backend}, list the points as a grid"
            )
        for bound in (poll_seconds, unreachable_seconds):  # refused before any job or head
            bound()
        self.batch = load_backend(session.backend).job_batch(
            session.reg, sweep, session.trials, cluster=session.cluster, tracking_uri=session.uri
        )
        # An address is a cluster pdm did not start here: what its nodes cannot share is refused.
        self.prove = bool(self.address) and not options.skip_cluster_check
        problems = (unshared(session.uri, self.batch) if self.prove else []) + self.batch.problems
        if problems:  # every one at once, before anything launches
            raise ValidationFailed(problems)

    def launch(self, session: SweepSession, todo: Todo) -> Launched:
        console, batch = session.console, self.batch
        batch.prepare(log=console.print)
        if self.prove:  # from every node, before the first submission (`pdm cluster check`)
            require_cluster_check(self.address, session.uri, batch, console)
        address = self.address
        if not address:
            from pdmask.orchestration.cluster.local_head import LocalRayHead

            head = LocalRayHead(
                num_gpus=CLUSTERS[session.cluster].gpus,
                log=console.print,
                scratch_env=batch.scratch_env,
            )
            address = session.hold(head).address  # stopped once the runs are settled
            session.interrupts.install()  # the head took SIGTERM and SIGHUP over as it started
        return self._run_on(session, todo, address, local_head=not self.address)

    def _run_on(
        self, session: SweepSession, todo: Todo, address: str, local_head: bool
    ) -> Launched:
        """The todo's jobs on the Ray cluster at ``address`` (``local_head``: one pdm started)."""
        sweep, batch = session.sweep, self.batch
        cluster = JobCluster(address)
        try:
            node_gpus = cluster.node_gpus()
        except ConnectionError as err:
            raise ConfigError(f"--address {address}: {err}") from None
        check_fit(session.trials, batch, node_gpus, session.cluster)
        tries = 1 + sweep.retries
        order = session.gate.order  # every setting's canary first
        jobs = [TrialJob(t, batch.resources(t).gpus, tries_left=tries) for t in order]
        session.console.print(f"{len(jobs)} trial(s) to run as Ray jobs on {cluster.address}")
        runner = JobRunner(
            session,
            cluster,
            batch,
            unreachable_s=unreachable_seconds(),
            progress=_progress(session, batch, order, node_gpus),
        )
        runner.adopt(jobs)
        lost = None
        try:
            runner.run(jobs)
        except ClusterLost as err:
            lost = str(err)
        _jobs_table(session, jobs)
        active = [j for j in jobs if j.state == "active"]
        ids = ", ".join(j.sid for j in active)
        # Jobs that run on after this invocation keep their runs RUNNING: the same command
        # attaches. A local head's jobs stop with it: their runs are settled as interrupted.
        if local_head:
            return Launched(
                lost_cluster=lost,
                resume_note=f"interrupted: {len(active)} job(s) stop with the local Ray head "
                f"({ids}); the same command resumes them from their checkpoints",
            )
        return Launched(
            detached=frozenset(j.trial.trial_hash for j in active),
            lost_cluster=lost,
            resume_note=f"detached: {len(active)} job(s) keep running on the cluster ({ids}); "
            "the same command attaches to them",
        )


def _progress(
    session: SweepSession, batch: JobBatch, order: list[Trial], node_gpus: list[float]
) -> JobsProgress:
    """The job loop's progress line, its ETA priced by the plan (the jobs' workloads, the
    cost model, the cells' measured step times) until the jobs measure their own."""
    specs = [batch.spec(t, run_id="", attempt=1).to_json() for t in order]
    plans = planned(
        order, session.planned_steps, cluster=session.cluster, specs=specs, tracking_uri=session.uri
    )
    wall_start = time.time() - (time.monotonic() - session.started)  # the sweep's, wall clock
    return JobsProgress(
        session.sweep.name,
        session.client,
        plans,
        Capacity(units=sum(node_gpus), trials=session.max_concurrent),
        session.console.print,
        started=wall_start,
    )


def _jobs_table(session: SweepSession, jobs: list[TrialJob]) -> None:
    """Each trial's attempts as Ray jobs, its state in this invocation and its last error (a
    trial without a job here finished before it: skipped)."""
    sweep = session.sweep
    ran = {j.trial.trial_hash: j for j in jobs}
    rows = []
    for trial in session.trials:
        job = ran.get(trial.trial_hash)
        if job is None:
            skipped = "skipped (finished before)"
            rows.append([trial.run_name(), trial.trial_hash[:10], "", skipped, ""])
            continue
        reason = failure_headline(job.reason)[:120] if job.state == "failed" else ""
        ids = ", ".join(
            submission_id(sweep.name, trial.trial_hash, a).rsplit("-", 1)[1]
            for a in sorted(job.attempts)
        )
        rows.append([trial.run_name(), trial.trial_hash[:10], ids, job.state, reason])
    session.console.print(
        table(
            f"sweep {sweep.name}: Ray jobs",
            ["trial", "hash", "attempts", "status", "last error"],
            rows,
            wrap={"last error"},
        )
    )
