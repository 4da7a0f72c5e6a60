"""A VeRL trial's Ray Job driver log lands in the state folder and goes with its MLflow run.

Against a real local Ray head with the stand-in trainer (as ``test_ray_jobs.py``): a trial that
fails its first attempt and succeeds on its retry has both attempts' driver logs, fetched through
the Jobs API, in ``<state>/logs/<sweep>/<run name>.<hash>.log``, each after its header; the
retry's log is there while its job still runs (held until the test releases it: ``pdm logs -f``
of a running trial shows what the job printed), once, with a line naming how the job ended; the
file is its run's artifact ``logs/<run name>.<hash>.log``; ``pdm logs`` prints it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import ONE_MACHINE, pdm_cmd, sweep_runs, tracking_client
from tests.cluster.test_ray_jobs import run_pdm, standin_env, write_sweep

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]


def test_job_driver_logs_land_in_the_state_folder(ray_head, project):
    write_sweep(project, "job-logs", ["pdm-agg"])
    release = project / "release-attempt-2"
    behaviour = {"pdm_agg": [{"result": "fail"}, {"result": "ok", "wait_for": str(release)}]}
    env = {**standin_env(project, behaviour), "PDM_JOB_LOG_SECONDS": "0.5"}
    argv = pdm_cmd("sweep", "job-logs", "--address", ray_head, *ONE_MACHINE, "--no-figures")
    sweep = subprocess.Popen(
        argv, env=env, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    logs = project / ".pdm" / "logs" / "job-logs"
    printed = "stand-in trainer: pdm_agg attempt 2"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and sweep.poll() is None:
            found = list(logs.glob("*.log"))
            if found and printed in found[0].read_text():
                break
            time.sleep(0.2)
        # the job waits for the release: what it printed is in the trial's log while it runs
        assert sweep.poll() is None and not release.exists()
        (live,) = logs.glob("*.log")
        assert printed in live.read_text() and "-a2 running, followed from" in live.read_text()
    finally:
        release.touch()
        out, _ = sweep.communicate(timeout=240)
    assert sweep.returncode == 0, out

    ((run,),) = sweep_runs(project, "job-logs").values()
    name, run_id = run.data.tags["mlflow.runName"], run.info.run_id
    file = f"{name}.{run.data.tags['pdm.trial_hash'][:8]}.log"
    log = project / ".pdm" / "logs" / "job-logs" / file
    text = log.read_text()
    first, second = text.index(" attempt 1 (trial "), text.index(" attempt 2 (trial ")
    ended = text.rindex("=== pdm: Ray job ")
    assert first < second < ended and "-a1 FAILED, fetched" in text[first:second]
    assert "stand-in trainer: pdm_agg attempt 1" in text[first:second]
    assert "-a2 running, followed" in text[second:ended] and printed in text[second:ended]
    assert text.count(printed) == 1 and "-a2 SUCCEEDED, fetched" in text[ended:]
    assert f"=== pdm trial log: {name} attempt 2 (trial " in text and f"run {run_id})" in text
    client = tracking_client(project)
    assert [a.path for a in client.list_artifacts(run_id, "logs")] == [f"logs/{file}"]
    copy = client.download_artifacts(run_id, f"logs/{file}", str(project))
    assert Path(copy).read_text() == text

    shown = run_pdm(project, env, "logs", name)
    assert shown.returncode == 0 and shown.stdout == text
