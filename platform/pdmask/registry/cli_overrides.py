"""Command-line overrides of a sweep: ``pdm sweep NAME key=value ...``.

Three forms, told apart by the key:

- a setting: any top-level field a sweep file may set (``profile=full``, ``steps=100``,
  ``seeds=4``, ``backend=verl``). It replaces the file's value before the sweep is validated,
  so it is checked exactly as the file is (the same model, the same messages); a problem names
  the override (``command line: steps=0: ...``) instead of a line of the file.
- ``seed``: a list replaces the sweep's seeds (``seed=[0,1,2,3]``: new seeds allowed), one
  seed keeps that seed of the sweep's (``seed=2``).
- an axis filter, named as sweep files name axes (``method``, ``model``, ``precision``,
  ``delta``, ``mu_source``, ``params.<name>``, ``sim.<knob>``): keeps the grid's cells whose
  axis has that value (or one of a list's: ``method=[pdm-agg,pdm-uni]``); a value the axis never
  takes is an error naming those it does.

Values are read with YAML's rules for scalars and flow collections (``[0,1]``, ``0.05``,
``true``). A filter selects and changes nothing: the trials it keeps have the hashes they have
without it. The overrides' canonical text (``canonical``) is shown in the plan and recorded on
every run the invocation starts (``OVERRIDES_TAG``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import yaml

from pdmask.errors import Problem, known_names
from pdmask.registry.registry import Registry
from pdmask.registry.sweeps import AXES, Sweep, is_axis, iter_cells, sweep_of, value_problem
from pdmask.registry.yaml_source import FieldPath, YamlSource

COMMAND_LINE = "command line"  # where an override's problems are (a file's path for a file's)
OVERRIDES_TAG = "pdm.overrides"
SEED = "seed"  # the one key that is neither a field nor an axis of a sweep file
# A sweep's name is its file's: a renamed sweep is a copy of the file under the new name.
NOT_SETTABLE = frozenset({"name"})


@dataclasses.dataclass(frozen=True)
class Override:
    """One ``key=value`` word of the command line, its value read as YAML."""

    key: str
    value: Any
    word: str  # as typed: what a problem names

    @property
    def canonical(self) -> str:
        return f"{self.key}={_flow(self.value)}"


def _flow(value: Any) -> str:
    """``value`` as one line of YAML flow style, the same however it was typed."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=True)
    return text.removesuffix("\n").removesuffix("\n...")


def canonical(overrides: Sequence[Override]) -> str:
    """The overrides as one line, sorted by key: what the plan shows and each run records."""
    return " ".join(o.canonical for o in sorted(overrides, key=lambda o: o.key))


def overrides_tag(words: Sequence[str]) -> dict[str, str]:
    """The tag each run of an invocation with ``words`` records: their canonical text."""
    overrides, _ = parse_overrides(words)
    return {OVERRIDES_TAG: canonical(overrides)} if overrides else {}


def known_keys() -> list[str]:
    """Every key an override may have (the open ``params.`` and ``sim.`` axes by prefix)."""
    fields = [f for f in Sweep.model_fields if f not in NOT_SETTABLE]
    return [*fields, SEED, *(a for a in AXES if a not in fields), "params.<name>", "sim.<knob>"]


def parse_overrides(words: Sequence[str]) -> tuple[list[Override], list[Problem]]:
    """The overrides of ``words`` (``key=value`` each) and the problems of those that cannot
    be read: no ``=``, bad YAML, an unknown or repeated key."""
    overrides: list[Override] = []
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for word in words:
        key, sep, text = word.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                Problem(COMMAND_LINE, word, "an override is key=value, e.g. seed=[0,1]")
            )
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as err:
            reason = getattr(err, "problem", None) or str(err).splitlines()[0]
            problems.append(Problem(COMMAND_LINE, word, f"not a YAML value: {reason}"))
            continue
        if key in NOT_SETTABLE:
            problems.append(
                Problem(
                    COMMAND_LINE,
                    word,
                    "a sweep's name is its file's: copy the file under the new name",
                )
            )
            continue
        if key not in Sweep.model_fields and key != SEED and not is_axis(key):
            problems.append(
                Problem(
                    COMMAND_LINE, word, f"unknown field {key!r}; {known_names(key, known_keys())}"
                )
            )
            continue
        field = "seeds" if key == SEED and isinstance(value, list) else key
        if field in seen:
            problems.append(
                Problem(COMMAND_LINE, word, f"sets {field} again (after {seen[field]})")
            )
            continue
        seen[field] = word
        overrides.append(Override(key, value, word))
    return overrides, problems


class OverriddenSource(YamlSource):
    """A sweep file's source with the command line's settings in its data: a problem of a value
    the command line set names the override, every other one the file's line."""

    def __init__(self, base: YamlSource, data: dict[str, Any], by_field: dict[str, str]):
        super().__init__(base.path, data, {})
        self.base = base
        self.by_field = by_field  # top-level field -> the override's word that set it

    def line(self, field: FieldPath) -> int | None:
        return self.base.line(field)

    def problem(self, field: FieldPath, message: str, display: str | None = None) -> Problem:
        if field and field[0] in self.by_field:
            return Problem(COMMAND_LINE, self.by_field[field[0]], message)
        return super().problem(field, message, display)


def with_overrides(reg: Registry, name: str, words: Sequence[str]) -> Registry:
    """``reg`` with sweep ``name`` as the command line's ``words`` change it. The problems of
    the overrides go with it (``Registry.command_line_problems``; a bad override is left out so
    the others are still checked): its expansion reports them with the sweep's own, all at once,
    and checks the overridden sweep as it checks a file."""
    if not words:
        return reg
    problems = list(reg.command_line_problems)
    overrides, found = parse_overrides(words)
    problems += found
    if name not in reg.sweeps:  # unknown or broken: the expansion says why
        return dataclasses.replace(reg, command_line_problems=problems)
    src = reg.sweep_sources[name]
    settings = [o for o in overrides if o.key != SEED and not _is_filter(o.key)]
    seeds = [o for o in overrides if o.key == SEED]
    filters = [o for o in overrides if _is_filter(o.key)]
    data = dict(src.data)
    by_field: dict[str, str] = {}
    for o in settings:
        data[o.key], by_field[o.key] = o.value, o.word
    for o in seeds:
        if isinstance(o.value, list):  # the new seed list, checked as the file's `seeds`
            data["seeds"], by_field["seeds"] = o.value, o.word
    overridden = OverriddenSource(src, data, by_field)
    sweep, found = sweep_of(overridden, name)
    for p in found:  # a union's two errors (`seeds`: a list or a count) read alike here
        problems += [] if p in problems else [p]
    if found:  # check the rest without the settings refused (the file's values instead)
        refused = {f for f, word in by_field.items() if any(p.field == word for p in found)}
        kept = {f: w for f, w in by_field.items() if f not in refused}
        data = {f: v for f, v in data.items() if f not in refused}
        data.update({f: src.data[f] for f in refused if f in src.data})
        overridden = OverriddenSource(src, data, kept)
        sweep, found = sweep_of(overridden, name)
    if sweep is None or found:
        return dataclasses.replace(reg, command_line_problems=problems)
    for o in seeds:
        if isinstance(o.value, list):
            continue
        if isinstance(o.value, bool) or o.value not in sweep.seed_list():
            problems.append(_off_axis(o, o.value, sweep.seed_list(), sweep.name))
        else:  # one of its seeds: the same trials, the others left out
            sweep = sweep.model_copy(update={"seeds": [o.value]})
    problems += _select(sweep, overridden, filters)
    return dataclasses.replace(
        reg,
        sweeps={**reg.sweeps, name: sweep},
        sweep_sources={**reg.sweep_sources, name: overridden},
        command_line_problems=problems,
    )


def _is_filter(key: str) -> bool:
    """An axis of the grid, not a field of the file (``backend`` is both: the field)."""
    return is_axis(key) and key not in Sweep.model_fields


def _select(sweep: Sweep, src: YamlSource, filters: list[Override]) -> list[Problem]:
    """Set ``sweep``'s selection to ``filters``; the problems of values its axes never take."""
    if not filters:
        return []
    if sweep.search is not None:
        return [
            Problem(COMMAND_LINE, o.word, "a search sweep has no grid to filter; set its `search`")
            for o in filters
        ]
    taken: dict[str, list[Any]] = {o.key: [] for o in filters}
    matched = [False] * len(sweep.overrides)
    for cell in iter_cells(sweep.grid, ("grid",), [], src):
        cell = Registry.apply_overrides(sweep, cell, matched)
        for axis, values in taken.items():
            if axis in cell and cell[axis][0] not in values:
                values.append(cell[axis][0])
    problems = []
    for o in filters:
        wanted = o.value if isinstance(o.value, list) else [o.value]
        bad = [p for v in wanted if (p := value_problem(v))]
        if bad or not wanted:
            problems.append(Problem(COMMAND_LINE, o.word, "; ".join(bad) or "an empty list"))
            continue
        off = [v for v in wanted if v not in taken[o.key]]
        if off:
            problems.append(_off_axis(o, off[0], taken[o.key], sweep.name))
            continue
        sweep.select(o.key, wanted)
    if not problems and not any(
        sweep.selects(Registry.apply_overrides(sweep, cell, matched))
        for cell in iter_cells(sweep.grid, ("grid",), [], src)
    ):
        words = " ".join(o.word for o in filters)
        problems.append(Problem(COMMAND_LINE, words, "together they keep no cell of the grid"))
    return problems


def _off_axis(o: Override, value: Any, taken: list[Any], sweep: str) -> Problem:
    axis = "seeds" if o.key == SEED else f"{o.key} axis"
    if not taken:
        return Problem(COMMAND_LINE, o.word, f"sweep {sweep} has no {o.key!r} axis to filter")
    return Problem(
        COMMAND_LINE,
        o.word,
        f"{value!r} is not on sweep {sweep}'s {axis}; {known_names(value, map(_flow, taken))}",
    )
