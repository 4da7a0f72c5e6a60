"""Safe YAML loading that remembers the line of every field, for error messages.

Beyond what ``yaml.safe_load`` checks, a file is refused when it is not UTF-8 text and when a
mapping repeats a key: YAML keeps the last value silently, so ``seeds: 1`` followed by
``seeds: 2`` would run a grid its author did not read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdmask.errors import Problem

FieldPath = tuple[str | int, ...]


def _walk(
    node: yaml.Node,
    path: FieldPath,
    lines: dict[FieldPath, int],
    duplicates: list[tuple[FieldPath, int]],
) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                duplicates.append(((*path, key), key_node.start_mark.line + 1))
            seen.add(key)
            _walk(value_node, (*path, key), lines, duplicates)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines, duplicates)


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


def load_yaml(path: Path) -> tuple[YamlSource | None, list[Problem]]:
    """Parse ``path`` safely. Unreadable or non-UTF-8 files and syntax errors give no source;
    duplicate keys give a source (its other problems are still worth reporting) and a problem
    per repeated key, with its line."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        return None, [Problem(str(path), "(file)", f"cannot read: {err.strerror}")]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        return None, [
            Problem(
                str(path),
                "(file)",
                f"not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})",
                line,
            )
        ]
    return parse_yaml(text, path)


def parse_yaml(text: str, path: Path) -> tuple[YamlSource | None, list[Problem]]:
    """Parse YAML ``text`` read from ``path`` (named in problems), as ``load_yaml`` does."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        return None, [Problem(str(path), "(syntax)", str(getattr(err, "problem", err)), line)]
    finally:
        loader.dispose()
    lines: dict[FieldPath, int] = {}
    duplicates: list[tuple[FieldPath, int]] = []
    if node is not None:
        _walk(node, (), lines, duplicates)
    problems = [
        Problem(
            str(path),
            ".".join(str(p) for p in field),
            "duplicate key: YAML would silently keep only the last value",
            line,
        )
        for field, line in duplicates
    ]
    return YamlSource(path, data, lines), problems
