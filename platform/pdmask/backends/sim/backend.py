"""The embedded backend's runtime (``registry.backends.SIM``): trials train in Ray Tune workers.

Light to import: the trainer and torch load when a trial trains or a config is built.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdmask.errors import ConfigError
from pdmask.registry.backends import SIM
from pdmask.registry.catalog import MODELS
from pdmask.registry.common_params import DELTA

if TYPE_CHECKING:
    from pdmask.backends.interface import Reporter
    from pdmask.backends.sim.config import SimTrialConfig
    from pdmask.registry import Recipe, Trial


REFUSED = "cannot run on the embedded backend"


def sim_config(trial: Trial) -> SimTrialConfig:
    """The embedded backend's config for a trial: its model's stand-in, its profile and steps
    (the sweep's, else the profile's), its delta (the first delta-role parameter's value,
    ``Trial.delta``), and what the recipe's parameters of the ``topk`` and ``ratio_cap`` roles
    say (PARAM_ROLES)."""
    from pydantic import ValidationError

    try:
        return _config(trial)
    except ValidationError as err:  # a configuration problem: fail fast, never retried
        raise ConfigError(f"trial {trial.run_name()} {REFUSED}: {err}") from None


def _config(trial: Trial) -> SimTrialConfig:
    from pdmask.backends.sim.config import SimTrialConfig

    recipe = trial.recipe()
    # A method without a trust-region radius (GRPO's clip) has its diagnostics measured at the
    # default of the delta parameter the recipes share.
    extra: dict[str, Any] = {"delta": DELTA.default if trial.delta is None else trial.delta}
    topk = recipe.role_value("topk", trial.params)
    if topk is not None:
        extra["top_k"] = int(topk)
    ratio_cap = recipe.role_value("ratio_cap", trial.params)
    if ratio_cap is not None:
        extra["ratio_cap"] = float(ratio_cap)
    if trial.steps is not None:  # the sweep's `steps`, else the profile's
        extra["steps"] = trial.steps
    return SimTrialConfig(
        stand_in=MODELS[trial.model].sim_stand_in,
        precision=trial.precision,
        profile=trial.profile,
        seed=trial.seed,
        **trial.sim,
        **extra,
    )


class SimBackend:
    spec = SIM

    def check(self, trial: Trial) -> list[str]:
        from pydantic import ValidationError

        try:
            _config(trial)
        except ValidationError as err:
            return [f"{REFUSED}: {err}"]
        return []

    def planned_steps(self, trial: Trial) -> int | None:
        return sim_config(trial).resolved().steps

    def eval_metrics(self, cluster: str) -> list[str]:
        from pdmask.backends.sim.evaluation import EVAL_METRIC

        return [EVAL_METRIC]  # the same on every cluster: it trains where it is started

    def train(
        self,
        trial: Trial,
        recipe: Recipe,
        *,
        reporter: Reporter,
        workdir: Path,
        should_stop: Callable[[], bool],
        note: Callable[[str], None],
    ) -> dict[str, float]:
        from pdmask.backends.sim.trainer import train_trial

        return train_trial(
            sim_config(trial),
            mask_fn=recipe.method(trial.params),
            reporter=reporter,
            workdir=workdir,
            should_stop=should_stop,
            note=note,
        )


BACKEND = SimBackend()
