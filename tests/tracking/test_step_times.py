"""Measured step times read from a real sqlite MLflow store: the median logged
``timing_s/step`` of the FINISHED and RUNNING VeRL runs of one model x precision x resources."""

from __future__ import annotations

from pdmask.tracking.step_times import StepTimes, resources_tag


def _run(client, experiment, status, steps, model="qwen3-8b-base", resources="1x8 H20"):
    run = client.create_run(
        experiment,
        tags={
            "pdm.backend": "verl",
            "pdm.model": model,
            "pdm.precision": "bf16",
            "pdm.verl.resources": resources,
        },
    )
    for i, seconds in enumerate(steps, start=1):
        client.log_metric(run.info.run_id, "timing_s/step", seconds, step=i)
    client.set_terminated(run.info.run_id, status)
    return run


def test_the_median_of_the_cells_finished_and_running_steps(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert StepTimes.read(uri).by_cell == {}  # no store yet: nothing, and nothing created
    assert not (tmp_path / "mlflow.db").exists()
    client = MlflowClient(uri)
    a, b = client.create_experiment("sweep-a"), client.create_experiment("sweep-b")
    _run(client, a, "FINISHED", [100.0, 110.0, 400.0])  # a save on the third step
    _run(client, b, "RUNNING", [120.0, 130.0])
    _run(client, a, "FAILED", [5.0, 5.0, 5.0])  # a failed run's steps are not a measure
    _run(client, a, "FINISHED", [900.0], resources="2x8 H20")  # another cluster shape
    _run(client, a, "FINISHED", [50.0], model="qwen3-4b-base")
    times = StepTimes.read(uri)
    got = times.seconds("qwen3-8b-base", "bf16", resources_tag(1, 8, "H20"))
    assert (got.seconds, got.runs, got.steps) == (120.0, 2, 5)
    assert times.seconds("qwen3-8b-base", "bf16", "2x8 H20").seconds == 900.0
    assert times.seconds("qwen3-8b-base", "fp8-rollout", "1x8 H20") is None
