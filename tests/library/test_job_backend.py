"""A second job-submitting backend plugs in as one module plus one spec, and a sweep trains on it.

``tests/fixtures/backends/pdm_bandit_jobs_backend.py`` is the module: the bandit of
``test_third_backend.py`` trained in Ray jobs. Everything else is pdmask's one job loop, reached
only through ``backends.interface``: a real Ray head started on loopback for the CPU profile
(``cluster/local_head.py``), the job API, the trials' MLflow runs in a real sqlite store, admission,
polling, settling, skip-finished on the rerun, the summary.
"""

from __future__ import annotations

import re

import pytest

from pdmask.registry import load_registry
from tests.library.conftest import fixture_backend_project

pytestmark = [pytest.mark.slow, pytest.mark.processes]

SWEEP = """\
name: bandit-jobs
description: "Two recipes on the bandit, each trial a Ray job."
backend: bandit-jobs
cluster: this-machine
profile: smoke
seeds: 1
retries: 0
grid:
  method: [dppo-topk-kl, pdm-agg]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.05]
"""


@pytest.fixture
def bandit_jobs(tmp_path, monkeypatch):
    """A project with a bandit-jobs sweep, the backend registered in this process, and its
    modules importable here and in the jobs; the job loop polls every second."""
    monkeypatch.setenv("PDM_JOB_POLL_SECONDS", "1")
    with fixture_backend_project(tmp_path, "pdm_bandit_jobs_backend", {"bandit-jobs": SWEEP}):
        yield tmp_path


def test_a_job_backend_in_one_module_trains_through_the_one_job_loop(bandit_jobs, capsys):
    from mlflow.tracking import MlflowClient

    import pdmask

    trials = load_registry().expand("bandit-jobs")
    assert {t.backend for t in trials} == {"bandit-jobs"} and len(trials) == 2
    result = pdmask.run_sweep("bandit-jobs", pdmask.SweepOptions(figures=False))
    out = capsys.readouterr().out
    assert result.ok, out[-4000:]
    client = MlflowClient(result.tracking_uri)
    experiment = client.get_experiment_by_name("bandit-jobs")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}, out[-4000:]
    for run in runs:
        tags = run.data.tags
        assert tags["pdm.backend"] == "bandit-jobs"
        assert tags["pdm.ray_job"] == f"pdm-bandit-jobs-{tags['pdm.trial_hash']}-a1"
        acc = client.get_metric_history(run.info.run_id, "val-core/bandit/acc/mean_at_16")
        values = [m.value for m in sorted(acc, key=lambda m: m.step)]
        assert len(values) == 7 and values[-1] > values[0], values  # it learned: steps 0..6
    assert "sweep bandit-jobs: Ray jobs" in out  # the job loop's table
    # its progress line as it polls: both jobs fit at once (they take no GPUs), the last line
    # when both ended
    progress = re.findall(r"\] bandit-jobs: (\d/2 done, \d running, \d failed, \d queued); "
                          r"elapsed \S+, ETA (\S+)", out)  # fmt: skip
    assert progress[0][0] == "0/2 done, 2 running, 0 failed, 0 queued", out[-4000:]
    assert progress[-1] == ("2/2 done, 0 running, 0 failed, 0 queued", "0s"), out[-4000:]
    assert "finished now" in out and "trial logs: " in out  # the runner's shared summary
    again = pdmask.run_sweep("bandit-jobs", pdmask.SweepOptions(figures=False))
    out = capsys.readouterr().out
    assert again.ok, out[-4000:]
    assert "2 already finished, 0 to run" in out, out[-4000:]
    assert len(client.search_runs([experiment.experiment_id])) == 2


TWO_SETTINGS = SWEEP.replace("name: bandit-jobs", "name: bandit-canary").replace(
    "seeds: 1\nretries: 0", "seeds: 2\nretries: 2"
)


def test_a_setting_that_fails_deterministically_stops_after_one_attempt_of_its_canary(
    tmp_path, monkeypatch, capsys
):
    """pdm-agg's jobs fail as on a node without a package (ImportError): its canary runs once
    (retries: 2 are for faults that can pass), its other trial is never submitted, the other
    setting trains both seeds, the summary names the error and the setting, exit code 1."""
    from mlflow.tracking import MlflowClient
    from pdm_bandit_backend import IMPORT_ERROR_ENV

    import pdmask

    monkeypatch.setenv("PDM_JOB_POLL_SECONDS", "1")
    monkeypatch.setenv(IMPORT_ERROR_ENV, "pdm-agg")
    with fixture_backend_project(
        tmp_path, "pdm_bandit_jobs_backend", {"bandit-canary": TWO_SETTINGS}
    ):
        trials = load_registry().expand("bandit-canary")
        result = pdmask.run_sweep("bandit-canary", pdmask.SweepOptions(figures=False))
    out = capsys.readouterr().out
    assert result.exit_code == 1, out[-4000:]
    agg = [t for t in trials if t.method == "pdm-agg"]
    assert len(trials) == 4 and len(agg) == 2
    submitted = [line for line in out.splitlines() if line.startswith("submitted pdm-")]
    assert len(submitted) == 3, out[-4000:]  # both dppo seeds, one attempt of pdm-agg's canary
    client = MlflowClient(result.tracking_uri)
    experiment = client.get_experiment_by_name("bandit-canary")
    runs = {
        r.data.tags["pdm.trial_hash"]: r for r in client.search_runs([experiment.experiment_id])
    }
    canary = [runs[t.trial_hash] for t in agg if t.trial_hash in runs]
    assert len(canary) == 1 and len(runs) == 3, "the canary's sibling never got a run"
    tags = canary[0].data.tags
    assert (tags["pdm.attempts"], tags["pdm.failure_kind"]) == ("1", "import")
    assert tags["pdm.ray_job"].endswith("-a1") and canary[0].info.status == "FAILED"
    dppo = [runs[t.trial_hash] for t in trials if t.method == "dppo-topk-kl"]
    assert [r.info.status for r in dppo] == ["FINISHED", "FINISHED"]
    outcome = result.outcome
    assert (outcome.finished, outcome.failed, outcome.not_started) == (2, 1, 1)
    (stopped,) = outcome.stopped
    assert stopped["setting"] == agg[0].cell_name() and stopped["not_started"] == 1
    assert "ImportError: No module named 'flash_attn'" in stopped["error"]
    line = f"setting {agg[0].cell_name()} stopped: ImportError: No module named 'flash_attn'"
    assert sum(line in x for x in out.splitlines()) == 2, out[-4000:]  # when it stops; summary
