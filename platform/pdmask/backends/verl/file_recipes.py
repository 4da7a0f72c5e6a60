"""A trial's recipe, carried by its VeRL job to every worker: the only way a method reaches verl.

A method is a file in the project's ``recipes/``; on a cluster that file is not installed on the
nodes, so every job carries its trial's recipe -- the source text planned with the sweep
(``Trial.recipe_source``), the resolved parameters, the precision -- in its runtime env
(``PDM_FILE_RECIPES``, JSON keyed by verl loss name), which reaches every worker on every node.
There the plugin registers the loss name on ``import verl`` (reading only the JSON: cheap), and the
loss runs the recipe's own mask and loss on the math API's statistics, executing the source on
first use. A recipe that *is* one of verl's own losses (``Recipe.verl_loss_mode``, e.g.
``vanilla``) travels too, for the record, but registers nothing: verl runs its own loss.

A carried file must be self-contained: it may import pdmask and installed packages, not files next
to it.

This module imports neither verl nor torch at import time: the plugin imports it in every process.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from pdmask.errors import ConfigError

ENV_VAR = "PDM_FILE_RECIPES"


@dataclass(frozen=True)
class FileRecipe:
    """One trial's recipe as it travels in a job's environment."""

    name: str  # the recipe's name (sweeps, MLflow tags)
    loss_mode: str  # its verl policy-loss name
    uses_delta: bool  # True when a parameter plays the ``delta`` role
    file: str  # the file's name, for tracebacks and error messages
    source: str  # the file's text, as planned
    params: dict[str, Any] = field(default_factory=dict)  # the trial's resolved parameters
    native: bool = False  # verl's own loss (configuration only): nothing to register
    precision: str | None = None  # the trial's precision setting (RecipeBatch.precision)
    source_hash: str = ""  # the normalised-code hash (the trial's pdm.recipe_hash)

    @classmethod
    def of(cls, recipe, params: dict[str, Any], precision: str | None = None) -> FileRecipe:
        """A loaded ``Recipe`` (its source as it was read) with resolved ``params``."""
        return cls(
            name=recipe.name,
            loss_mode=recipe.verl_name,
            uses_delta=recipe.uses_delta,
            file=recipe.source.file,
            source=recipe.source.text,
            params=dict(params),
            native=recipe.verl_loss_mode is not None,
            precision=precision,
            source_hash=recipe.source.hash,
        )

    @classmethod
    def of_trial(cls, trial) -> FileRecipe:
        """What the job of ``trial`` carries: its recipe as planned, never re-read."""
        return cls.of(trial.recipe(), trial.params, trial.precision)

    def recipe(self):
        """The carried ``Recipe``, executed from the carried source."""
        from pdmask.registry.recipe_files import recipe_from_source

        try:
            recipe = recipe_from_source(f"recipes/{self.file}", self.source)
        except Exception as err:
            raise ConfigError(f"recipe file {self.file} (carried in {ENV_VAR}): {err!r}") from err
        if recipe.name != self.name:
            raise ConfigError(
                f"recipe file {self.file} (carried in {ENV_VAR}): RECIPE must declare {self.name!r}"
            )
        return recipe

    def role_value(self, role: str, default: Any = None) -> Any:
        """The carried value of the parameter playing ``role`` (PARAM_ROLES), else ``default``."""
        value = self.recipe().role_value(role, self.params)
        return default if value is None else value

    def method(self, roles: dict[str, Any]):
        """The math API's ``Method`` with the carried parameters, those of ``roles`` replaced by
        the job's own knobs (``pdm_delta``, ``pdm_topk``, ``pdm_ratio_cap``: the same values
        unless someone edited the job's overrides, and then the job's win)."""
        recipe = self.recipe()
        return recipe.method(recipe.with_roles(self.params, roles))

    def env(self) -> dict[str, str]:
        """The job's environment entry (one recipe per job: a job trains one trial)."""
        return {ENV_VAR: json.dumps({self.loss_mode: asdict(self)}, sort_keys=True)}


@cache
def declared() -> dict[str, FileRecipe]:
    """The recipes of this process's job, by verl loss name (empty outside such a job)."""
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return {}
    try:
        return {mode: FileRecipe(**entry) for mode, entry in json.loads(raw).items()}
    except (ValueError, TypeError) as err:
        raise ConfigError(
            f"environment variable {ENV_VAR}: not a pdmask recipe list ({err})"
        ) from None


def pdmask_losses() -> dict[str, FileRecipe]:
    """The carried recipes whose loss pdmask registers (all but verl's own losses)."""
    return {mode: entry for mode, entry in declared().items() if not entry.native}
