"""Writing a test recipe file into a scratch project (the `project` fixture's copy)."""

from __future__ import annotations

import textwrap
from pathlib import Path

HEADER = '"""A test recipe."""\n\nimport torch\n\nfrom pdmask.registry import Param, Recipe\n\n'


def write(project: Path, stem: str, body: str) -> Path:
    """``recipes/<stem>.py`` in ``project``: the usual imports, then ``body`` dedented."""
    path = project / "recipes" / f"{stem}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def recipe_call(name: str, extra: str) -> str:
    """A ``RECIPE = Recipe(...)`` line for ``name`` with ``extra`` keyword arguments."""
    return (
        f'RECIPE = Recipe(name="{name}", display_name="{name}", color="#123456", '
        f'summary="s", {extra})\n'
    )
