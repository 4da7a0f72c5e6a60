"""A VeRL trial's Ray Job driver log lands in the state folder and goes with its MLflow run.

Against a real local Ray head with the stand-in trainer (as ``test_ray_jobs.py``): a trial that
fails its first attempt and succeeds on its retry has both attempts' driver logs, fetched through
the Jobs API when each job ended, in ``<state>/logs/<sweep>/<run name>.<hash>.log``, each after its
header, and the file is its run's artifact ``logs/<run name>.<hash>.log``; ``pdm logs`` prints it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import ONE_MACHINE, sweep_runs, tracking_client
from tests.cluster.test_ray_jobs import run_pdm, standin_env, write_sweep

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]


def test_job_driver_logs_land_in_the_state_folder(ray_head, project):
    write_sweep(project, "job-logs", ["pdm-agg"])
    env = standin_env(project, {"pdm_agg": [{"result": "fail"}, {"result": "ok"}]})
    out = run_pdm(
        project, env, "sweep", "job-logs", "--address", ray_head, *ONE_MACHINE, "--no-figures"
    )
    assert out.returncode == 0, out.stdout + out.stderr

    ((run,),) = sweep_runs(project, "job-logs").values()
    name, run_id = run.data.tags["mlflow.runName"], run.info.run_id
    file = f"{name}.{run.data.tags['pdm.trial_hash'][:8]}.log"
    log = project / ".pdm" / "logs" / "job-logs" / file
    text = log.read_text()
    first, second = text.index("-a1 FAILED, fetched"), text.index("-a2 SUCCEEDED, fetched")
    assert first < second
    assert "stand-in trainer: pdm_agg attempt 1" in text[first:second]
    assert "stand-in trainer: pdm_agg attempt 2" in text[second:]
    assert f"=== pdm trial log: {name} attempt 2 (trial " in text and f"run {run_id})" in text
    client = tracking_client(project)
    assert [a.path for a in client.list_artifacts(run_id, "logs")] == [f"logs/{file}"]
    copy = client.download_artifacts(run_id, f"logs/{file}", str(project))
    assert Path(copy).read_text() == text

    shown = run_pdm(project, env, "logs", name)
    assert shown.returncode == 0 and shown.stdout == text
