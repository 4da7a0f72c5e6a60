"""Fixtures shared by the VeRL tests."""

from .recipe_env import carried, carry  # noqa: F401  (a job's carried recipe in this process)
