"""What a caller of a public entry point must catch is documented, and lives in ``pdmask.errors``.

Each entry point's docstring has a ``Raises:`` section (Google style) whose every exception is a
class of ``pdmask/errors.py``'s tree (``PdmError`` and below), so that one ``except`` clause per
kind of failure is enough and the CLI's exit codes follow from them.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

import pdmask.errors

ENTRY_POINTS = [
    "pdmask.api:run_sweep",
    "pdmask.api:runs",
    "pdmask.api:history",
    "pdmask.api:plan",
    "pdmask.orchestration.runner:run_sweep",
    "pdmask.orchestration.preflight:validate_sweeps",
    "pdmask.registry.registry:Registry.sweep",
    "pdmask.registry.registry:Registry.expand",
    "pdmask.backends.interface:load_backend",
    "pdmask.tracking.store:open_client",
    "pdmask.figures.build:build_figure",
    "pdmask.analysis.runner:run_token_analysis",
]
RAISED = re.compile(r"^ {4}(\w+):", re.MULTILINE)


def _entry(path: str):
    module, _, qualname = path.partition(":")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def raises_section(doc: str) -> list[str]:
    """The exception names a Google-style ``Raises:`` section lists (empty: none)."""
    _, found, rest = doc.partition("\nRaises:\n")
    if not found:
        return []
    section = re.split(r"\n\S", rest, maxsplit=1)[0]  # up to the next unindented line
    return RAISED.findall(section)


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_an_entry_point_documents_what_it_raises_from_the_errors_tree(path):
    doc = inspect.getdoc(_entry(path)) or ""
    names = raises_section(doc)
    assert names, f"{path}: no Raises: section"
    outside = [
        n
        for n in names
        if not (
            isinstance(getattr(pdmask.errors, n, None), type)
            and issubclass(getattr(pdmask.errors, n), pdmask.errors.PdmError)
        )
    ]
    assert not outside, f"{path}: {outside} are not in pdmask/errors.py's tree"


def test_the_section_reader_sees_each_name_and_nothing_after_the_section():
    doc = "Do it.\n\nRaises:\n    ConfigError: bad input,\n        over two lines.\n    TrackingError: x\nNote: y\n"
    assert raises_section(doc) == ["ConfigError", "TrackingError"]
    assert raises_section("Do it.") == []
