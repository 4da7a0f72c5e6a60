"""A search sweep on Ray Tune: its space, and an Optuna searcher warm-started with what finished.

Every finished point of the sweep (its ``pdm.search_point`` tag, written by the worker) is handed
to Optuna with its result, so a second invocation continues the search instead of restarting it.
"""

from __future__ import annotations

import json

from pdmask.registry import Sweep
from pdmask.tracking import runs_by_hash, sanitize_metric

OBJECTIVE = "pdm_objective"  # what the worker reports the searched metric as
SEARCH_POINT_TAG = "pdm.search_point"


def search_space(sweep: Sweep, client, experiment_id: str):
    """Tune search space and an Optuna searcher warm-started with the finished trials' results."""
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    space = {}
    for axis, dim in sweep.search.space.items():
        if dim.choices is not None:
            space[axis] = tune.choice(dim.choices)
        else:
            space[axis] = (tune.loguniform if dim.log else tune.uniform)(dim.low, dim.high)
    points, rewards = [], []
    for runs in runs_by_hash(client, experiment_id).values():
        for r in runs:
            value = r.data.metrics.get(sanitize_metric(sweep.search.metric))
            if r.info.status == "FINISHED" and value is not None:
                trial = json.loads(r.data.tags.get(SEARCH_POINT_TAG, "{}") or "{}")
                if set(trial) == set(space):
                    points.append({"search": trial})
                    rewards.append(value)
    searcher = OptunaSearch(
        metric=OBJECTIVE,
        mode=sweep.search.mode,
        seed=0,
        points_to_evaluate=points or None,
        evaluated_rewards=rewards or None,
    )
    return space, searcher
