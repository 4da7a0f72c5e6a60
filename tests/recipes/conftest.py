"""Fixtures of the recipe tests."""

import contextlib

from tests.registry.conftest import project  # noqa: F401  (a scratch copy of the registry)

with contextlib.suppress(ImportError):  # a job's carried recipe (the VeRL loss path); needs verl
    from tests.verl.recipe_env import carried, carry  # noqa: F401
