"""Safe YAML loading that remembers the line of every field, for error messages.

Beyond what ``yaml.safe_load`` checks, a file is refused when it is not UTF-8 text and when a
mapping repeats a key: YAML keeps the last value silently, so ``seeds: 1`` followed by
``seeds: 2`` would run a grid its author did not read.

Every project file is read by every command (the registry lists them all), so one hostile or
accidental file must cost a problem, never the process: files are refused beyond
``MAX_YAML_BYTES``, beyond ``MAX_DEPTH`` levels of nesting and beyond ``MAX_NODES`` values once
aliases are expanded (a "billion laughs" file is a few hundred bytes that expand to 10^9
values; anchors and aliases of ordinary size, as the shipped sweeps use, stay fine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdmask.errors import Problem

FieldPath = tuple[str | int, ...]

# A sweep or dashboard file is a few KB; the largest shipped one is under 4 KB.
MAX_YAML_BYTES = 1 << 20
# Levels of nesting: a sweep's deepest field (grid cells' overrides) is 5 levels down.
MAX_DEPTH = 64
# Values after alias expansion: a grid of every method, model, precision and delta is a few
# hundred; a checker walking more than this would take seconds per command.
MAX_NODES = 100_000


def _extent(node: yaml.Node, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(values, depth) of ``node`` with aliases expanded, in time linear in the file: an aliased
    node is measured once however often it is used."""
    key = id(node)
    if key not in memo:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        memo[key] = (0, 0)  # a cycle (impossible in YAML 1.1 documents) counts once
        sizes = [_extent(child, memo) for child in children]
        memo[key] = (
            1 + sum(size for size, _ in sizes),
            1 + max((depth for _, depth in sizes), default=0),
        )
    return memo[key]


def _too_large(node: yaml.Node) -> str | None:
    values, depth = _extent(node, {})
    if depth > MAX_DEPTH:
        return f"nested {depth} levels deep; the limit is {MAX_DEPTH}"
    if values > MAX_NODES:
        return (
            f"expands to {values:,} values once its aliases are resolved; the limit is "
            f"{MAX_NODES:,} (an alias bomb?)"
        )
    return None


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
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            return None, [_size_problem(path, size)]
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


def _size_problem(path: Path, size: int) -> Problem:
    return Problem(
        str(path), "(file)", f"{size:,} bytes; the limit for a YAML file is {MAX_YAML_BYTES:,}"
    )


def parse_yaml(text: str, path: Path) -> tuple[YamlSource | None, list[Problem]]:
    """Parse YAML ``text`` read from ``path`` (named in problems), as ``load_yaml`` does."""
    if (size := len(text.encode("utf-8"))) > MAX_YAML_BYTES:
        return None, [_size_problem(path, size)]
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        too_large = _too_large(node) if node is not None else None
        if too_large:  # before anything walks it as a tree
            return None, [Problem(str(path), "(file)", too_large, node.start_mark.line + 1)]
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        return None, [Problem(str(path), "(syntax)", str(getattr(err, "problem", err)), line)]
    except RecursionError:  # PyYAML composes nested nodes recursively
        return None, [
            Problem(str(path), "(file)", f"nested too deep to parse; the limit is {MAX_DEPTH}")
        ]
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
