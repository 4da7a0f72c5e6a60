"""A Tune trial's config and the pdmask trial it stands for, read the same way in the driver (the
progress rows, Tune's folder names) and in the worker (``trainable.run_trial``).

A grid's config carries its trial whole. A search's carries the template trial (the space's
midpoint, ``Registry.expand``) and the point Optuna sampled (``search``): ``delta`` sets the
recipe's parameters of the ``delta`` role, whatever they are called, as the grid's axis does,
and ``params.<name>`` the parameter of that name.
"""

from __future__ import annotations

import os
from typing import Any

from pdmask.registry import Trial


def trial_from_config(config: dict[str, Any]) -> Trial:
    """The trial of a Tune config: a planned trial, or a search template plus sampled values."""
    trial = Trial.model_validate(config["trial"])
    sampled = config.get("search") or {}
    if not sampled:
        return trial
    recipe = trial.recipe()
    params = dict(trial.params)
    for axis, value in sampled.items():
        if axis != "delta":
            params[axis.removeprefix("params.")] = value
            continue
        # The template's delta-role parameters the axis set hold its delta; one the search's
        # base names keeps its own value (``Registry.expand``'s rule for a grid cell).
        for name in recipe.role_params("delta"):
            if params.get(name) == trial.delta:
                params[name] = recipe.params[name].normalise(float(value))
    delta = recipe.role_value("delta", params)
    return trial.model_copy(
        update={"params": params, "delta": None if delta is None else float(delta)}
    )


def tune_dirnames():
    """Tune's ``trial_dirname_creator``: a trial's folder under the sweep's Tune results is its
    run name (with its trial hash appended when another trial of the sweep has the same name)."""
    taken: dict[str, str] = {}  # folder name -> trial hash

    def dirname(tune_trial) -> str:
        trial = trial_from_config(tune_trial.config)
        name = trial.run_name()
        if taken.setdefault(name, trial.trial_hash) != trial.trial_hash:
            name = f"{name}-{trial.trial_hash[:12]}"
        return name.replace(os.sep, "_")

    return dirname
