"""The project's recipes as the check runs them: at the sweeps' delta, every error raised."""

from __future__ import annotations

DELTA = 0.15  # the paper's larger trust-region radius


def recipe_with_params(name: str):
    """``(recipe, params)`` of the recipe file ``name``, its parameters resolved at DELTA."""
    from pdmask.paths import project_root
    from pdmask.registry.recipe_files import discover_recipes

    folder = discover_recipes(project_root() / "recipes")
    if folder.problems:
        raise RuntimeError(f"recipes/ has problems: {folder.problems}")
    recipe = folder.recipes[name]
    params, errors = recipe.resolve_params({"delta": DELTA})
    if errors:
        raise RuntimeError(f"{name}: {errors}")
    return recipe, params
