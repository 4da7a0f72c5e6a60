"""Reuse across sweeps on a real sqlite store (``tracking/reuse.py``): a FINISHED, complete run of
a trial in another experiment is found and linked with its whole metric history; a link is never
itself a source, an incomplete run is never reused, a half-copied link is deleted."""

from __future__ import annotations

import pytest

from pdmask.backends.interface import load_backend
from pdmask.orchestration.session import reusable
from pdmask.registry import load_registry
from pdmask.tracking import TrialRun, ensure_experiment, runs_by_hash
from pdmask.tracking.completeness import Plan
from pdmask.tracking.reuse import (
    REUSED_FROM_RUN,
    REUSED_FROM_SWEEP,
    drop_broken_links,
    link,
)

from .conftest import ROOT

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def setup(main_figure_store):
    """The store, its experiment main-figure and two trials of the smoke sweep (a few steps
    each) in it: the first trained complete and FINISHED, the second FINISHED without its last
    validation (as runs could end before the completeness rule)."""
    client, exp = main_figure_store
    reg = load_registry(ROOT)
    trials = reg.expand("smoke")[:2]
    backend = load_backend(trials[0].backend)
    metrics = backend.eval_metrics(reg.sweeps["smoke"].cluster)
    for trial, validations in zip(trials, ((0, "last"), (0,)), strict=True):
        plan = Plan.of(backend.planned_steps(trial), metrics)
        run = TrialRun.start_or_resume(client, exp, trial, {}, log_params=True)
        for step in range(plan.last_step + 1):
            values = {"actor/pdm/masked_frac": 0.01 * step}
            if step in validations or (step == plan.last_step and "last" in validations):
                values[metrics[0]] = 0.5 + 0.01 * step
            run.log(step, values)
        run.finish()
    return client, exp, trials, metrics


def _history(client, run_id: str) -> dict[str, list[tuple]]:
    run = client.get_run(run_id)
    return {
        key: sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }


def test_a_complete_run_elsewhere_is_linked_with_its_history_and_an_incomplete_one_is_not(setup):
    client, exp, (complete, incomplete), metrics = setup
    other = ensure_experiment(client, "renamed")
    found = reusable(client, other, [complete, incomplete], metrics)
    assert list(found) == [complete.trial_hash]  # the run without its last validation is not
    source = found[complete.trial_hash]
    assert source.sweep == "main-figure" and source.label.startswith("main-figure/")
    run_id = link(client, source, other, "renamed", {"pdm.overrides": "seed=[0, 1]"})
    linked = client.get_run(run_id)
    original = source.run
    assert linked.info.status == "FINISHED" and linked.info.experiment_id == other
    assert linked.data.tags[REUSED_FROM_RUN] == original.info.run_id
    assert linked.data.tags[REUSED_FROM_SWEEP] == "main-figure"
    assert linked.data.tags["pdm.sweep"] == "renamed"
    assert linked.data.tags["pdm.trial_hash"] == complete.trial_hash
    assert linked.data.tags["pdm.overrides"] == "seed=[0, 1]"
    assert original.info.run_id in linked.data.tags["mlflow.note.content"]
    assert linked.data.params == original.data.params and linked.data.params
    history = _history(client, run_id)
    assert history == _history(client, original.info.run_id)
    assert len(history[metrics[0]]) == 2 and len(history["actor/pdm/masked_frac"]) > 2
    # a third sweep finds the original, never the link
    third = ensure_experiment(client, "third")
    again = reusable(client, third, [complete], metrics)
    assert again[complete.trial_hash].run.info.run_id == original.info.run_id
    # the linking sweep's own run is not "elsewhere" for it
    assert reusable(client, exp, [complete], metrics) == {}


def test_a_half_copied_link_is_deleted_before_it_could_pass_for_a_result(setup):
    client, exp, (trial, _), _ = setup
    other = ensure_experiment(client, "killed-mid-copy")
    tags = {"pdm.trial_hash": trial.trial_hash, REUSED_FROM_RUN: "abc"}
    broken = client.create_run(other, tags=tags).info.run_id  # left RUNNING by a SIGKILL
    by_hash = runs_by_hash(client, other)
    drop_broken_links(client, by_hash)
    assert by_hash[trial.trial_hash] == []
    assert client.get_run(broken).info.lifecycle_stage == "deleted"
