"""A VeRL job's carried recipe in this process: what every worker of that job sees.

Every pdmask method reaches verl as the recipe its job carries (``PDM_FILE_RECIPES``); tests that
run verl's loss path for a method set that variable as the job builder would.
"""

from __future__ import annotations

import pytest

from pdmask.backends.verl import file_recipes, plugin
from pdmask.backends.verl.file_recipes import ENV_VAR, FileRecipe


def _reset() -> None:
    file_recipes.declared.cache_clear()


@pytest.fixture
def carried(monkeypatch):
    """``carried(value)``: set a job's ``PDM_FILE_RECIPES`` (JSON) and register its losses."""

    def set_env(value: str) -> None:
        monkeypatch.setenv(ENV_VAR, value)
        _reset()
        plugin.register_losses()

    yield set_env
    monkeypatch.delenv(ENV_VAR, raising=False)
    _reset()


@pytest.fixture
def carry(carried):
    """``carry(name, **params)``: the project's recipe ``name`` as its job would carry it;
    returns the ``FileRecipe`` (its ``loss_mode`` is the verl loss name)."""
    from tests.methods import project_recipes

    def make(name: str, precision: str = "bf16", **params) -> FileRecipe:
        recipe = project_recipes()[name]
        resolved, errors = recipe.resolve_params(
            {k: v for k, v in params.items() if k in recipe.params}
        )
        assert not errors, errors
        entry = FileRecipe.of(recipe, resolved, precision)
        carried(entry.env()[ENV_VAR])
        return entry

    return make
