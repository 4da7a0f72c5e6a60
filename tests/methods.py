"""The project's methods for tests: each is its recipe in recipes/ (the only list of methods)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


@cache
def project_recipes():
    from pdmask.registry import load_registry

    reg = load_registry(ROOT)
    assert not reg.recipe_problems, reg.recipe_problems
    return reg.recipes


def method(name: str, **params):
    """The recipe ``name`` with ``params`` (those it declares; defaults for the rest) bound."""
    recipe = project_recipes()[name]
    resolved, errors = recipe.resolve_params(
        {k: v for k, v in params.items() if k in recipe.params}
    )
    assert not errors, errors
    return recipe.method(resolved)


def mask_of(name: str, stats, advantages, valid=None, **params) -> torch.Tensor:
    """The recipe's mask on these statistics (every token valid unless ``valid`` says otherwise)."""
    from pdmask.trust_region import apply_method

    valid = torch.ones_like(advantages, dtype=torch.bool) if valid is None else valid
    return apply_method(method(name, **params), stats, advantages, valid, backend="math").mask
