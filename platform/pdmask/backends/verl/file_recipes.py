"""Recipes from a project's ``recipes/`` folder that the math API does not know, trained on VeRL.

A new baseline is one file in ``recipes/``; on a cluster that file is not installed on the nodes,
so the job carries it. The job builder writes each such recipe -- its file's source text, its
resolved parameters -- into the job's runtime env (``PDM_FILE_RECIPES``, JSON keyed by verl loss
name), which reaches every worker on every node. There the plugin registers the loss names on
``import verl`` (reading only the JSON: cheap), and the loss runs the recipe's own mask on the math
API's statistics, loading the source on first use.

Which recipes travel: every recipe whose per-token mask is not exactly a math-API method of the
same name -- a new name, an own ``mask`` function, or a built-in name recomposed from other tests.
A file that travels must be self-contained: it may import pdmask and installed packages, not
files next to it.

This module imports neither verl nor torch at import time: the plugin imports it in every process.
"""

from __future__ import annotations

import json
import os
import sys
import types
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pdmask.errors import ConfigError

ENV_VAR = "PDM_FILE_RECIPES"


@dataclass(frozen=True)
class FileRecipe:
    """One recipe as it travels in a job's environment."""

    name: str  # the recipe's name (sweeps, MLflow tags)
    loss_mode: str  # its verl policy-loss name
    uses_delta: bool  # True when the recipe declares a ``delta`` parameter
    file: str  # the file's name, for tracebacks and error messages
    source: str  # the file's text
    params: dict[str, Any] = field(default_factory=dict)  # the trial's resolved parameters

    @classmethod
    def of(cls, recipe, path: Path, params: dict[str, Any]) -> FileRecipe:
        return cls(
            name=recipe.name,
            loss_mode=recipe.verl_name,
            uses_delta=recipe.uses_delta,
            file=Path(path).name,
            source=Path(path).read_text(),
            params=dict(params),
        )

    def env(self) -> dict[str, str]:
        """The job's environment entry (one recipe per job: a job trains one trial)."""
        return {ENV_VAR: json.dumps({self.loss_mode: asdict(self)}, sort_keys=True)}


def needs_to_travel(recipe) -> bool:
    """False only for a recipe that is exactly the math-API method of the same name."""
    from pdmask.trust_region import METHODS

    spec = METHODS.get(recipe.name)
    return (
        spec is None
        or recipe.mask is not None
        or (recipe.proximity, recipe.direction) != (spec.proximity, spec.direction)
    )


@cache
def declared() -> dict[str, FileRecipe]:
    """The file recipes of this process's job, by verl loss name (empty outside such a job)."""
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return {}
    try:
        return {mode: FileRecipe(**entry) for mode, entry in json.loads(raw).items()}
    except (ValueError, TypeError) as err:
        raise ConfigError(
            f"environment variable {ENV_VAR}: not a pdmask recipe list ({err})"
        ) from None


@cache
def load(loss_mode: str):
    """The ``Recipe`` of a declared file recipe, executed from its carried source."""
    entry = declared()[loss_mode]
    module_name = f"pdmask_recipe_{entry.name.replace('-', '_')}"
    module = types.ModuleType(module_name)
    module.__file__ = f"recipes/{entry.file}"
    sys.modules[module_name] = module  # pydantic and pickling look the module up by name
    try:
        exec(compile(entry.source, module.__file__, "exec"), module.__dict__)
    except Exception as err:
        raise ConfigError(f"recipe file {entry.file} (carried in {ENV_VAR}): {err!r}") from err
    recipe = getattr(module, "RECIPE", None)
    if recipe is None or getattr(recipe, "name", None) != entry.name:
        raise ConfigError(
            f"recipe file {entry.file} (carried in {ENV_VAR}): RECIPE must declare {entry.name!r}"
        )
    return recipe


def mask_function(loss_mode: str, delta: float | None):
    """``fn(stats, advantages) -> bool mask`` of a file recipe, its parameters bound; the job's
    ``pdm_delta`` (the same value) wins over the carried one."""
    entry = declared()[loss_mode]
    params = dict(entry.params)
    if delta is not None and entry.uses_delta:
        params["delta"] = delta
    return load(loss_mode).mask_fn(params)
