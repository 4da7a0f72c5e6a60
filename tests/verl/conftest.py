"""Fixtures shared by the VeRL tests."""

from .data_fixtures import prepared  # noqa: F401  (a data folder `prepare` made from the fixtures)
from .recipe_env import carried, carry  # noqa: F401  (a job's carried recipe in this process)
