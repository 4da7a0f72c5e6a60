"""The launch order of a sweep's trials: one of each model in turn, every trial exactly once."""

from __future__ import annotations

from collections import Counter

import pytest

from pdmask.orchestration.canary import launch_order
from pdmask.registry import load_registry

pytestmark = pytest.mark.processes


def test_the_first_trials_are_of_different_models_and_none_is_lost():
    trials = load_registry().expand("main-figure")
    order = launch_order(trials)
    assert sorted(t.trial_hash for t in order) == sorted(t.trial_hash for t in trials)
    models = {t.model for t in trials}
    assert len(models) == 3
    assert {t.model for t in order[: len(models)]} == models  # three warm starts built at once
    # Within a model the sweep's own order is kept.
    for model in models:
        assert [t for t in order if t.model == model] == [t for t in trials if t.model == model]
    assert Counter(t.model for t in order) == Counter(t.model for t in trials)
