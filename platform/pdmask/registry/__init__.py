"""The typed experiment registry: recipes, models, precisions, clusters, sweeps and trials.

Public API::

    load_registry(root=None) -> Registry      # discover recipes/, sweeps/, dashboards/
    Registry.expand(sweep, backend=, profile=) -> list[Trial]   # raises ValidationFailed
    Registry.left_out(sweep, backend=) -> {reason: LeftOut}  # cells that backend does not run
    Recipe, Param, PARAM_ROLES                # what a file in recipes/ declares
    Trial                                     # one resolved trial; .trial_hash is its identity,
                                              #   .recipe() the recipe it trains (as planned)
    recipe_check.check_recipes(recipes, trials)   # run recipes' code on synthetic batches
    MODELS, PRECISIONS, CLUSTERS              # the fixed catalog
    BACKENDS, BackendSpec, register_backend   # the training backends (registry/backends.py)
    plan_rows(trials, cluster) -> list[PlanRow]
"""

from pdmask.registry.backends import BACKENDS, BackendSpec, Launch, register_backend
from pdmask.registry.catalog import (
    CLUSTERS,
    MODELS,
    PRECISIONS,
    ClusterProfile,
    ModelSpec,
    PrecisionSpec,
)
from pdmask.registry.plan import PlanRow, plan_rows
from pdmask.registry.recipes import KNOWN_INPUTS, PARAM_ROLES, Param, Recipe
from pdmask.registry.registry import Registry, load_registry
from pdmask.registry.sweeps import SearchSpec, Sweep
from pdmask.registry.trial import Trial

__all__ = [
    "BACKENDS",
    "BackendSpec",
    "Launch",
    "CLUSTERS",
    "KNOWN_INPUTS",
    "PARAM_ROLES",
    "MODELS",
    "PRECISIONS",
    "ClusterProfile",
    "ModelSpec",
    "Param",
    "PlanRow",
    "PrecisionSpec",
    "Recipe",
    "Registry",
    "SearchSpec",
    "Sweep",
    "Trial",
    "load_registry",
    "plan_rows",
    "register_backend",
]
