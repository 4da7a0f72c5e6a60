"""A tracking server that refuses a run's metric writes mid-run: a real ``mlflow server`` behind
the refusing proxy (``tests/verl_cpu/refusing_proxy.py``), verl's real ``Tracking`` and pdmask's
guard around its MLflow adapter, in this process.

verl's adapter would drop the refused step and train on; the guard ends the attempt with
``IncompleteRun`` naming the step, the run ends FAILED with a reason whose exception a job's log
classifies as ``incomplete`` (retried), and the retry, resumed from the step before, logs the
step again: every step once. The real VeRL job meets the same fault in
``verl_cpu/test_verl_sweep.py``.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]

import mlflow  # noqa: E402

from pdmask.backends.verl import tracking  # noqa: E402
from pdmask.backends.verl.overrides import job_env  # noqa: E402
from pdmask.errors import IncompleteRun  # noqa: E402
from pdmask.orchestration.jobs.cluster import last_exception  # noqa: E402
from pdmask.tracking.completeness import Plan, gap  # noqa: E402
from pdmask.tracking.runs import FailureKind, exception_kind  # noqa: E402
from tests.cluster.two_node import _get, start_tracking_server, wait_until  # noqa: E402
from tests.verl.test_tracking import job_config, start_verl_tracking  # noqa: E402
from tests.verl_cpu.refusing_proxy import RefusingProxy  # noqa: E402

# MLflow retries a 503 inside each call (7 times, backoff up to minutes by default); two quick
# retries keep the test short and still show that MLflow's own retries were refused too.
MLFLOW_RETRIES = 2


@pytest.fixture(scope="module")
def proxy():
    started = start_tracking_server()
    try:
        uri = started.extra["uri"]
        wait_until(started, lambda: _get(f"{uri}/health") == 200, "the MLflow server")
        with RefusingProxy(uri) as proxy:
            yield proxy
    finally:
        started.stop()


def test_a_refused_metric_write_fails_the_attempt_and_its_retry_logs_the_step(proxy, monkeypatch):
    for key, value in {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(MLFLOW_RETRIES),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    }.items():
        monkeypatch.setenv(key, value)
    client = mlflow.MlflowClient(proxy.uri)
    experiment_id = client.create_experiment("main-figure")
    run_id = client.create_run(experiment_id, run_name="trial-1").info.run_id
    for key, value in job_env(tracking_uri=proxy.uri, run_id=run_id).items():
        monkeypatch.setenv(key, value)
    config = job_config()
    logger = start_verl_tracking(config)
    tracking.start_of_training(config, logger)
    for step in (0, 1):
        logger.log({tracking.STEP_METRIC: step, "actor/pg_loss": 1.0 - step / 10}, step=step)

    proxy.refuse(run_id)
    began = time.monotonic()
    refused = pytest.raises(IncompleteRun, match=r"refused step 2's metrics")
    with refused as raised, tracking.failure_marked():  # as the job's fit() is wrapped
        logger.log({tracking.STEP_METRIC: 2, "actor/pg_loss": 0.8}, step=2)
    took = time.monotonic() - began
    assert run_id in str(raised.value) and "3 times" in str(raised.value)
    # every try of verl's three was a request MLflow itself retried: all refused, all step 2
    assert proxy.refusals == [(run_id, [2])] * (3 * (1 + MLFLOW_RETRIES)), proxy.refusals
    run = client.get_run(run_id)  # the tags and the status passed the proxy: metrics only refused
    assert run.info.status == "FAILED"
    reason = run.data.tags[tracking.FAILURE_TAG]
    assert exception_kind(last_exception(reason)) == FailureKind.INCOMPLETE, reason
    assert gap(client, run_id, Plan(3)) == (
        "its metrics stop at step 1, before the planned last step 3"
    )

    proxy.allow(run_id)  # the server is back: the retry resumes from step 1's checkpoint
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)  # ending the run unset it in this process
    retry = start_verl_tracking(config)
    tracking.start_of_training(config, retry)
    for step in (2, 3):
        retry.log({tracking.STEP_METRIC: step, "actor/pg_loss": 1.0 - step / 10}, step=step)
    retry.finish()
    history = client.get_metric_history(run_id, tracking.STEP_METRIC)
    assert sorted(m.step for m in history) == [0, 1, 2, 3]
    assert gap(client, run_id, Plan(3)) is None
    print(f"refused step 2: the attempt ended {took:.1f} s after the first refusal")
