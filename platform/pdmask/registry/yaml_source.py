"""Safe YAML loading that remembers the line of every field, for error messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdmask.errors import Problem

FieldPath = tuple[str | int, ...]


def _walk(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[(*path, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines)


class YamlSource:
    """A parsed YAML file plus ``line(path)`` for any field path (nearest known parent)."""

    def __init__(self, path: Path, data: Any, lines: dict[FieldPath, int]):
        self.path = path
        self.data = data
        self._lines = lines

    def line(self, field: FieldPath) -> int | None:
        field = tuple(field)
        while field:
            if field in self._lines:
                return self._lines[field]
            field = field[:-1]
        return self._lines.get(())

    def problem(self, field: FieldPath, message: str, display: str | None = None) -> Problem:
        name = display if display is not None else ".".join(str(p) for p in field) or "(file)"
        return Problem(str(self.path), name, message, self.line(field))


def load_yaml(path: Path) -> tuple[YamlSource | None, Problem | None]:
    """Parse ``path`` safely; a syntax error becomes a Problem with its line."""
    try:
        text = path.read_text()
    except OSError as err:
        return None, Problem(str(path), "(file)", f"cannot read: {err.strerror}")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        return None, Problem(str(path), "(syntax)", str(getattr(err, "problem", err)), line)
    lines: dict[FieldPath, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return YamlSource(path, data, lines), None
