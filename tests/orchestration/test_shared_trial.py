"""Two different sweeps that share a trial, run at once on one state folder: the second waits for
the first to release the trial, trains its own run of it, says so, and both exit 0. Before, the
second exited 130 saying "interrupted 1" though nothing interrupted it, and its rerun trained the
trial again."""

from __future__ import annotations

import json

import pytest

from .conftest import ONE_TRIAL, SLOW, pdm, pdm_background, sweep_runs, write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.processes]


def test_a_trial_shared_by_two_sweeps_running_at_once_finishes_in_both(project):
    (project / "recipes" / "slow.py").write_text(SLOW)
    grid = ONE_TRIAL.replace("method: [pdm-agg]", "method: [slow]")
    write_sweep(project, "first", grid)
    write_sweep(project, "second", grid)  # the same grid: the same trial, by hash
    procs = {name: pdm_background(project, "sweep", name) for name in ("first", "second")}
    outs = {name: proc.communicate(timeout=600)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, outs[name]
    runs = {name: sweep_runs(project, name) for name in procs}
    assert all(len(r) == 1 and r[0].info.status == "FINISHED" for r in runs.values()), runs
    (shared,) = {r[0].data.tags["pdm.trial_hash"] for r in runs.values()}
    assert shared
    waited = [
        name
        for name, (run,) in runs.items()
        if any(
            "waited for sweep" in n["note"]
            for n in json.loads(run.data.tags.get("pdm.notes", "[]"))
        )
    ]
    assert len(waited) == 1, outs  # which one is up to the scheduler
    (name,) = waited
    other = "first" if name == "second" else "second"
    assert f"waiting: sweep {other} is training the same trial" in " ".join(outs[name].split())
    for name in procs:  # a rerun trains nothing again
        again = pdm(project, "sweep", name)
        assert again.returncode == 0 and "0 to run" in again.stdout, again.stdout
