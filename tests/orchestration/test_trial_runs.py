"""A trial's checkpoint and its MLflow run stay together; a refused config fails its run once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import ONE_TRIAL, env_for, pdm, store_client, sweep_runs, write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.processes]

STEPS = [0, 1, 2, 3, 4]  # the smoke profile: base evaluation at 0, then 4 RL steps


def _only_run(client, sweep: str):
    exp = client.get_experiment_by_name(sweep)
    (run,) = client.search_runs([exp.experiment_id])
    return run


def _steps(client, run, key="val-core/synth/acc/mean_at_16") -> list[int]:
    return sorted({m.step for m in client.get_metric_history(run.info.run_id, key)})


def _assert_trained(client, run) -> None:
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "critic/score/mean")] == [
        1,
        2,
        3,
        4,
    ]
    assert _steps(client, run) == [0, 2, 4]


def test_a_checkpoint_only_continues_the_run_it_belongs_to(project):
    write_sweep(project, "one", ONE_TRIAL)
    assert pdm(project, "sweep", "one").returncode == 0
    client = store_client(project)
    first = _only_run(client, "one")
    _assert_trained(client, first)
    workdir = project / ".pdm" / "trials" / first.data.tags["pdm.trial_hash"]
    assert (workdir / "checkpoint.pt").exists()  # the final checkpoint survives the run

    # The run is lost (deleted) while its checkpoint survives: the trial trains again from
    # scratch into a new run (before: resumed at its last step, logged nothing, FINISHED).
    client.delete_run(first.info.run_id)
    out = pdm(project, "sweep", "one")
    assert out.returncode == 0, out.stdout + out.stderr
    second = _only_run(client, "one")
    assert second.info.run_id != first.info.run_id
    _assert_trained(client, second)
    assert "discarded" in second.data.tags["pdm.notes"]
    assert json.loads((workdir / "owner.json").read_text())["run_id"] == second.info.run_id

    # Its checkpoints damaged (the last one truncated, the previous one random bytes) while the
    # run is not finished (an interrupted sweep's): the rerun moves both aside, trains from
    # scratch in the same run, says so in the trial log and the run's notes, and finishes.
    client.set_terminated(second.info.run_id, status="KILLED")
    last = (workdir / "checkpoint.pt").read_bytes()
    (workdir / "checkpoint.pt").write_bytes(last[: len(last) // 3])
    (workdir / "checkpoint.prev.pt").write_bytes(os.urandom(4096))
    out = pdm(project, "sweep", "one")
    assert out.returncode == 0, out.stdout + out.stderr
    third = _only_run(client, "one")
    assert third.info.run_id == second.info.run_id
    _assert_trained(client, third)
    assert sorted(p.name.split(".corrupt-")[0] for p in workdir.glob("*.corrupt-*")) == [
        "checkpoint.prev.pt",
        "checkpoint.pt",
    ]
    notes = [n["note"] for n in json.loads(third.data.tags["pdm.notes"])]
    assert any(n.startswith("training from scratch") and "unreadable" in n for n in notes), notes
    hash8 = third.data.tags["pdm.trial_hash"][:8]
    log = (project / ".pdm" / "logs" / "one" / f"{third.info.run_name}.{hash8}.log").read_text()
    assert "moved aside to checkpoint.pt.corrupt-" in log

    # Another tracking store: its run must hold the whole trial too.
    other = project / ".pdm" / "other.db"
    out = pdm(project, "sweep", "one", "--tracking-uri", f"sqlite:///{other}")
    assert out.returncode == 0, out.stdout + out.stderr
    _assert_trained(
        store_client(project, "other.db"), _only_run(store_client(project, "other.db"), "one")
    )
    # ... and back on the first store the finished trial is skipped, not retrained.
    again = pdm(project, "sweep", "one")
    assert again.returncode == 0 and "1 already finished, 0 to run" in again.stdout


REFUSED_INSIDE_THE_TRIAL = textwrap.dedent(
    """
    import contextlib, dataclasses, json, sys
    from pdmask.orchestration.options import SweepOptions
    from pdmask.orchestration.runner import run_sweep
    from pdmask.registry import load_registry

    reg = load_registry()
    sweep = reg.sweep("one")
    (trial,) = reg.expand("one")
    # A value no sweep file can carry any more (validation refuses it): the trial's own checks
    # are the last line of defence, and must fail it once, as a configuration error.
    nan = float("nan")
    trial = trial.model_copy(update={"delta": nan, "params": {**trial.params, "delta": nan}})
    with contextlib.redirect_stdout(sys.stderr):  # its summary; the outcome alone on stdout
        outcome = run_sweep(reg, sweep, [trial], SweepOptions(max_concurrent=1, figures=False))
    print(json.dumps(dataclasses.asdict(outcome)))
    """
)


def test_a_config_error_inside_a_trial_fails_its_run_once_and_is_reported_as_such(project):
    write_sweep(project, "one", ONE_TRIAL)  # retries: 2
    done = subprocess.run(
        [sys.executable, "-c", REFUSED_INSIDE_THE_TRIAL],
        capture_output=True,
        text=True,
        env=env_for(project),
        cwd=project,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["config_errors"] == 1, outcome
    assert (outcome["interrupted"], outcome["failed"], outcome["finished"]) == (0, 0, 0)
    (run,) = sweep_runs(project, "one")
    assert run.info.status == "FAILED"
    assert run.data.tags["pdm.failure_kind"] == "config"
    assert run.data.tags["pdm.failure_reason"].startswith("configuration error")
    assert run.data.tags["pdm.attempts"] == "1"  # never retried
    assert "configuration refused" in done.stderr  # the summary row, not "interrupted"
