"""Dispatch to a training backend: ``run_backend(trial, recipe, ...)``.

- ``sim``: the embedded CPU trainer (this machine, a laptop, a Ray worker).
- ``verl``: VeRL jobs on a GPU cluster, submitted as Ray Jobs (``pdmask.backends.verl``); they do
  not run inside this process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdmask.errors import BackendUnavailable, ConfigError
from pdmask.registry import MODELS, Recipe, Trial

Reporter = Callable[[int, dict[str, float]], None]


def sim_config(trial: Trial):
    """The embedded backend's config for a trial: its model's stand-in, and what the recipe's
    parameters of the ``delta``, ``topk`` and ``ratio_cap`` roles say (PARAM_ROLES)."""
    from pydantic import ValidationError

    from pdmask.backends.sim import SimTrialConfig

    recipe = trial.recipe()
    extra: dict[str, Any] = {}
    if trial.delta is not None:
        extra["delta"] = trial.delta
    topk = recipe.role_value("topk", trial.params)
    if topk is not None:
        extra["top_k"] = int(topk)
    ratio_cap = recipe.role_value("ratio_cap", trial.params)
    if ratio_cap is not None:
        extra["ratio_cap"] = float(ratio_cap)
    try:
        return SimTrialConfig(
            stand_in=MODELS[trial.model].sim_stand_in,
            precision=trial.precision,
            profile=trial.profile,
            seed=trial.seed,
            **trial.sim,
            **extra,
        )
    except ValidationError as err:  # a configuration problem: fail fast, never retried
        raise ConfigError(
            f"trial {trial.run_name()} cannot run on the embedded backend: {err}"
        ) from None


def planned_steps(trial: Trial) -> int | None:
    """How many steps the trial will report (for progress and ETA)."""
    if trial.backend == "sim":
        return sim_config(trial).resolved().steps
    return trial.steps


def run_backend(
    trial: Trial,
    recipe: Recipe,
    *,
    reporter: Reporter,
    workdir: Path,
    should_stop: Callable[[], bool],
) -> dict[str, float]:
    """Train one trial in this process (resuming from ``workdir``'s checkpoint).

    ``recipe`` is the trial's own (``trial.recipe()``, the source planned with the sweep). An
    error in its code is raised as ``RecipeError`` (a ``ConfigError``: never retried).
    """
    if trial.backend == "sim":
        from pdmask.backends.sim import train_trial

        return train_trial(
            sim_config(trial),
            mask_fn=recipe.method(trial.params),
            reporter=reporter,
            workdir=workdir,
            should_stop=should_stop,
        )
    raise BackendUnavailable(
        f"backend {trial.backend!r} does not train in-process: submit the sweep with --backend verl "
        "--address http://HEAD:8265 (VeRL jobs on a Ray cluster)"
    )
