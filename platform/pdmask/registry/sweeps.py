"""Sweeps: named grids in the project's ``sweeps/`` folder, and their expansion into trials.

A sweep file (YAML) declares its axes as a grid. A grid node is one of:

- a mapping ``{axis: [values], ...}``: the product of those axes, in order;
- ``{product: [node, ...]}``: the product of the nodes' cells;
- ``{zip: {axis: [values], ...}}``: the i-th values of every axis together (equal lengths);
- ``{union: [node, ...]}``: the cells of every node, one after the other.

Axes: ``method``, ``model``, ``precision``, ``delta``, ``mu_source``, ``params.<name>`` (a
recipe parameter), ``sim.<knob>`` (an embedded-backend knob, ``registry/sim_knobs.py``; such
cells run on the embedded backend only) and ``backend`` (the one backend a cell runs on: under
any other the cell is left out, e.g. a method only the embedded backend can supply inputs for). ``seeds`` is an axis too (a list, or a count n for seeds
0..n-1), crossed with the grid. ``overrides`` change cells that match a ``where`` clause. A sweep may instead declare a
``search`` (Optuna through Ray Tune): a space and a budget, optimising a named metric.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from pdmask.errors import Problem, known_names
from pdmask.registry.backends import BACKENDS, DEFAULT_BACKEND
from pdmask.registry.sim_knobs import AXIS_PREFIX as SIM_AXIS_PREFIX
from pdmask.registry.yaml_source import FieldPath, YamlSource, load_yaml

AXES = ("method", "model", "precision", "delta", "mu_source", "backend")
REQUIRED_AXES = ("method", "model", "precision")  # every cell needs them
SIM_PROFILES = ("smoke", "default", "full", "stress")  # = sim PROFILES
SWEEP_SUFFIXES = (".yaml", ".yml")
# The largest seed every trainer accepts: numpy's legacy seeding (vLLM seeds it with the
# trial's seed) takes 32 bits, torch's 64. A larger seed passed every check and failed at training.
MAX_SEED = 2**32 - 1
# A grid larger than this is refused unless confirmed (the sweep's `max_trials`, or the
# `--max-trials` flag): at about 30 s per embedded trial, 1,000 trials are eight hours on two
# cores, and a typo in a grid (one more axis, a long delta list) multiplies the count silently.
DEFAULT_MAX_TRIALS = 1000


def is_axis(name: Any) -> bool:
    return isinstance(name, str) and (
        name in AXES
        or any(name.startswith(p) and len(name) > len(p) for p in ("params.", SIM_AXIS_PREFIX))
    )


def value_problem(value: Any) -> str | None:
    """Why ``value`` cannot stand on an axis, or None. One value per cell: a name, a number,
    a flag or null; a float must be finite (NaN compares false with every bound, so it would
    pass every range check and train on garbage)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if value is None or isinstance(value, str | int | float | bool):
        return None
    return f"must be a single value (a name or a number), got {type(value).__name__} {value!r}"


class Override(BaseModel):
    """Per-cell override: cells whose axes match ``where`` get the values in ``set``."""

    model_config = ConfigDict(extra="forbid")

    where: dict[str, Any] = Field(
        min_length=1, description="Axis values a cell must have, e.g. {method: pdm-agg}."
    )
    set: dict[str, Any] = Field(
        min_length=1, description="Axis values or `params.<name>` to set on matching cells."
    )

    @field_validator("where", "set")
    @classmethod
    def _axes(cls, value: dict[str, Any]) -> dict[str, Any]:
        problems = [
            f"{k!r} is not an axis; known: {list(AXES)} or params.<name>"
            for k in value
            if not is_axis(k)
        ]
        problems += [f"{k}: {p}" for k, v in value.items() if (p := value_problem(v))]
        if problems:
            raise ValueError("; ".join(problems))
        return value


class SearchDim(BaseModel):
    """One searched axis: a float range (optionally log-scaled) or a list of choices."""

    model_config = ConfigDict(extra="forbid")

    low: float | None = Field(None, description="Lower bound of a float range.")
    high: float | None = Field(None, description="Upper bound of a float range.")
    log: bool = Field(False, description="Sample the range on a log scale.")
    choices: list[Any] | None = Field(
        None, min_length=1, description="Discrete values instead of a range."
    )

    @model_validator(mode="after")
    def _shape(self) -> SearchDim:
        if self.choices is None:
            if self.low is None or self.high is None:
                raise ValueError("give low and high, or choices")
            if not (math.isfinite(self.low) and math.isfinite(self.high)):
                raise ValueError(f"low ({self.low}) and high ({self.high}) must be finite")
            if not self.low < self.high:
                raise ValueError(f"low ({self.low}) must be below high ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError("a log-scaled range needs low > 0")
        else:
            bad = [p for v in self.choices if (p := value_problem(v))]
            if bad:
                raise ValueError(f"choices: {'; '.join(bad)}")
        return self


class SearchSpec(BaseModel):
    """A search sweep: Optuna (TPE) through Ray Tune picks points of ``space``."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        description="Metric to optimise (its last reported value), e.g. val-core/synth/acc/mean_at_16."
    )
    mode: Literal["max", "min"] = Field("max", description="Maximise or minimise the metric.")
    budget: int = Field(ge=1, description="Number of trials to run.")
    space: dict[str, SearchDim] = Field(
        min_length=1, description="Searched axes (`delta`, `params.<name>`)."
    )
    base: dict[str, Any] = Field(
        description="Fixed values of every other axis (method, model, precision, ...)."
    )

    @field_validator("space", "base")
    @classmethod
    def _axes(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = [k for k in value if not is_axis(k)]
        if unknown:
            raise ValueError(f"{unknown} not axes; known: {list(AXES)} or params.<name>")
        return value


class Sweep(BaseModel):
    """A named set of trials (a grid or a search), its budget and the figures it feeds."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Sweep name: `pdm sweep NAME`; also the MLflow experiment.")
    description: str = Field(description="What the sweep reproduces or tests.")
    figures: list[str] = Field(
        default_factory=list, description="Dashboards built when it finishes."
    )
    backend: str = Field(
        DEFAULT_BACKEND,
        description="Default backend, one of `registry/backends.py` (`--backend` overrides).",
        json_schema_extra={"enum": sorted(BACKENDS)},  # an editor's choices: the built-in ones
    )
    profile: str = Field(
        "default",
        description=f"Budget profile of a backend that has them (the embedded one): "
        f"{list(SIM_PROFILES)}; refused where the sweep's own backend has none (VeRL), left "
        "out where `--backend` moves the sweep to one that has none.",
    )
    steps: int | None = Field(
        None,
        ge=1,
        description="RL steps per trial on every backend (None: the backend's own: the "
        "profile's on the embedded backend, 300 on VeRL).",
    )
    cluster: str = Field(
        "h20x32", description="Cluster profile for planning (`--cluster` overrides)."
    )
    seeds: list[StrictInt] | StrictInt = Field(
        2,
        description=f"Seeds: a list of distinct seeds in 0..{MAX_SEED}, or a count n >= 1 for "
        "seeds 0..n-1.",
    )
    grid: dict[str, Any] | None = Field(
        None, description="The grid of axes (see the module docstring)."
    )
    overrides: list[Override] = Field(default_factory=list, description="Per-cell overrides.")
    search: SearchSpec | None = Field(None, description="A search instead of a grid.")
    max_concurrent: int | None = Field(None, ge=1, description="Cap on trials running at once.")
    retries: int = Field(2, ge=0, description="Retries of a crashed trial before it stays FAILED.")
    max_trials: int | None = Field(
        None,
        ge=1,
        description=f"Confirms a large grid: expansion refuses more trials than this (default "
        f"{DEFAULT_MAX_TRIALS}; `--max-trials` overrides).",
    )

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        if value not in BACKENDS:
            raise ValueError(f"unknown backend {value!r}; known: {sorted(BACKENDS)}")
        return value

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int] | int) -> list[int] | int:
        if isinstance(value, int):
            if value < 1:
                raise ValueError(f"a seed count must be at least 1, got {value} (no trials)")
            if value - 1 > MAX_SEED:
                raise ValueError(f"a seed count of {value} gives seeds beyond {MAX_SEED}")
            return value
        if not value:
            raise ValueError("an empty seed list gives no trials")
        if any(s < 0 for s in value):
            raise ValueError(f"seeds must be >= 0, got {value}")
        if any(s > MAX_SEED for s in value):
            raise ValueError(
                f"seeds must be at most {MAX_SEED} (numpy's seeding, which vLLM uses, takes "
                f"32 bits; torch's 64), got {[s for s in value if s > MAX_SEED]}"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"seeds repeat: {value}")
        return value

    @model_validator(mode="after")
    def _grid_or_search(self) -> Sweep:
        if (self.grid is None) == (self.search is None):
            raise ValueError("declare exactly one of `grid` and `search`")
        return self

    # Where each override stands in the file: a sweep salvaged from a broken file may have
    # lost some (see _salvage), and problems must still point at the right ones.
    _override_positions: list[int] | None = PrivateAttr(None)

    # The command line's axis filters (``registry/cli_overrides.py``): axis -> the values kept.
    # They select cells and change nothing in them, so no trial's hash depends on them.
    _selection: dict[str, list[Any]] = PrivateAttr(default_factory=dict)

    def selects(self, cell: Cell) -> bool:
        """Whether ``cell`` (per-cell overrides applied) passes the command line's filters: a
        cell without a filtered axis does not."""
        return all(
            axis in cell and cell[axis][0] in values for axis, values in self._selection.items()
        )

    def select(self, axis: str, values: list[Any]) -> None:
        """Keep only the cells whose ``axis`` has one of ``values`` (a command-line filter)."""
        self._selection[axis] = list(values)

    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    def override_position(self, i: int) -> int:
        """Index in the file of ``overrides[i]``."""
        return i if self._override_positions is None else self._override_positions[i]


# A cell maps axis -> (value, field path in the file) so errors can point at the value's line.
Cell = dict[str, tuple[Any, FieldPath]]


def grid_size(node: Any) -> int:
    """How many cells ``node`` expands to, counted without expanding it (0 if malformed)."""
    if not isinstance(node, dict) or not node:
        return 0
    keys = set(node)
    if keys in ({"product"}, {"union"}):
        (kind,) = keys
        children = node[kind]
        if not isinstance(children, list) or not children:
            return 0
        sizes = [grid_size(c) for c in children]
        return sum(sizes) if kind == "union" else math.prod(sizes)
    if keys == {"zip"}:
        axes = node["zip"]
        if not isinstance(axes, dict) or not axes:
            return 0
        lengths = {len(v) if isinstance(v, list) else -1 for v in axes.values()}
        return lengths.pop() if len(lengths) == 1 and -1 not in lengths else 0
    return math.prod(len(v) if isinstance(v, list) else 1 for v in node.values())


def iter_cells(
    node: Any, path: FieldPath, problems: list[Problem], src: YamlSource
) -> Iterator[Cell]:
    """The cells of a grid node, produced one at a time (a large grid is never held in memory).
    Problems of the node's shape are appended to ``problems`` once, as the walk meets them."""
    if not isinstance(node, dict) or not node:
        problems.append(src.problem(path, "a grid node must be a non-empty mapping"))
        return
    keys = set(node)
    if keys in ({"product"}, {"union"}):
        (kind,) = keys
        children = node[kind]
        if not isinstance(children, list) or not children:
            problems.append(src.problem((*path, kind), "expects a non-empty list of grid nodes"))
            return
        if kind == "union":
            for i, child in enumerate(children):
                yield from iter_cells(child, (*path, kind, i), problems, src)
            return
        # The product's later factors are replayed for every cell of the first: keep them.
        first, *others = children
        rest = [
            list(iter_cells(c, (*path, kind, i + 1), problems, src)) for i, c in enumerate(others)
        ]
        for head in iter_cells(first, (*path, kind, 0), problems, src):
            for combo in itertools.product(*rest):
                yield _merge((head, *combo), problems, src)
        return
    if keys == {"zip"}:
        axes = node["zip"]
        if not isinstance(axes, dict) or not axes:
            problems.append(src.problem((*path, "zip"), "expects a mapping of axis -> list"))
            return
        lengths = {a: len(v) if isinstance(v, list) else -1 for a, v in axes.items()}
        if len(set(lengths.values())) != 1 or -1 in lengths.values():
            problems.append(
                src.problem((*path, "zip"), f"zip needs lists of equal length, got {lengths}")
            )
            return
        good = [a for a in axes if _axis_ok(a, (*path, "zip", a), problems, src)]
        columns = {
            a: _checked_values(axes[a], (*path, "zip", a), problems, src, distinct=False)
            for a in good
        }
        if any(len(c) != len(axes[a]) for a, c in columns.items()):
            return  # a refused value (reported) would shift the zip's pairs
        for i in range(next(iter(lengths.values()))):
            yield {a: columns[a][i] for a in good}
        return
    columns = [
        (axis, _checked_values(values, (*path, axis), problems, src))
        for axis, values in node.items()
        if _axis_ok(axis, (*path, axis), problems, src)
    ]
    if any(not column and axis in REQUIRED_AXES for axis, column in columns):
        return
    # An optional axis with no usable value is left out, so the rest is still checked.
    columns = [(axis, column) for axis, column in columns if column]
    for combo in itertools.product(*(column for _, column in columns)):
        yield {axis: value for (axis, _), value in zip(columns, combo, strict=True)}


def _checked_values(
    values: Any, path: FieldPath, problems: list[Problem], src: YamlSource, distinct: bool = True
) -> list[tuple[Any, FieldPath]]:
    """An axis's usable (value, path) pairs; each unusable value is a problem (and is left out,
    so the cells of the others still show their own problems). ``distinct``: a repeated value
    is a problem too (a product's axis; a zip's columns pair values up and may repeat)."""
    if not isinstance(values, list):
        values, paths = [values], [path]
    else:
        paths = [(*path, i) for i in range(len(values))]
    if not values:
        problems.append(src.problem(path, "an empty list gives no trials; list at least one value"))
        return []
    good: list[tuple[Any, FieldPath]] = []
    first: dict[Any, int] = {}
    for item, (value, where) in enumerate(zip(values, paths, strict=True)):
        message = value_problem(value)
        if message:
            problems.append(src.problem(where, message))
        elif distinct and value in first:  # the grid plans it once: the author listed it twice
            problems.append(
                src.problem(where, f"repeats {value!r} (item {first[value]}): list it once")
            )
        else:
            first[value] = item
            good.append((value, where))
    return good


def _axis_ok(axis: str, path: FieldPath, problems: list[Problem], src: YamlSource) -> bool:
    if is_axis(axis):
        return True
    problems.append(
        src.problem(
            path, f"unknown axis {axis!r}; known: {list(AXES)}, params.<name> or sim.<knob>"
        )
    )
    return False


def _merge(parts: tuple[Cell, ...], problems: list[Problem], src: YamlSource) -> Cell:
    merged: Cell = {}
    for part in parts:
        for axis, value in part.items():
            if axis in merged and merged[axis][0] != value[0]:
                problem = src.problem(value[1], f"axis {axis!r} is set twice in one product")
                if problem not in problems:  # the same clash recurs in every combination
                    problems.append(problem)
            merged[axis] = value
    return merged


def _salvage(data: dict[str, Any], err: ValidationError, stem: str) -> Sweep | None:
    """The sweep without its invalid parts, so the file's other problems (unknown methods,
    bad values in the grid, overrides that match nothing) are reported in the same run as its
    schema errors. A bad item of a list (one override) drops that item, a bad field the field."""
    if any(not e["loc"] for e in err.errors()):
        return None  # a whole-file problem (grid and search both or neither): nothing to expand
    kept = dict(data)
    bad_items: dict[str, set[int]] = {}
    for e in err.errors():
        key, rest = e["loc"][0], e["loc"][1:]
        if isinstance(kept.get(key), list) and rest and isinstance(rest[0], int):
            bad_items.setdefault(key, set()).add(rest[0])
        else:
            kept.pop(key, None)
    for key, items in bad_items.items():
        kept[key] = [v for i, v in enumerate(kept[key]) if i not in items]
    kept.setdefault("name", stem)
    kept.setdefault("description", "")
    try:
        sweep = Sweep.model_validate(kept)
    except ValidationError:
        return None  # a required field (grid or search) was itself invalid
    if "overrides" in bad_items:
        dropped = bad_items["overrides"]
        sweep._override_positions = [i for i in range(len(data["overrides"])) if i not in dropped]
    return sweep


def load_sweep_file(path: Path) -> tuple[Sweep | None, YamlSource | None, list[Problem]]:
    """The sweep of one file, its source and every problem found in it. A sweep is returned
    with problems when the file is broken only in part (so expansion can report the rest)."""
    src, problems = load_yaml(path)
    if src is None:
        return None, None, problems
    sweep, found = sweep_of(src, path.stem)
    return sweep, src, [*problems, *found]


def sweep_of(src: YamlSource, stem: str) -> tuple[Sweep | None, list[Problem]]:
    """The sweep of a parsed source named ``stem`` and its schema's problems, each made by
    ``src.problem`` (a file's line; an override's words for a value the command line set)."""
    if not isinstance(src.data, dict):
        return None, [src.problem((), "a sweep file must be a mapping")]
    problems: list[Problem] = []
    try:
        sweep = Sweep.model_validate(src.data)
    except ValidationError as err:
        problems += [src.problem(tuple(e["loc"]), _schema_message(e)) for e in err.errors()]
        sweep = _salvage(src.data, err, stem)
    if sweep is not None and sweep.name != stem:
        problems.append(src.problem(("name",), f"must match the file name {stem!r}"))
    return sweep, problems


def _schema_message(error: dict[str, Any]) -> str:
    """A schema error in words: an unknown top-level field with the fields meant (pydantic says
    only "Extra inputs are not permitted")."""
    loc = error["loc"]
    if error["type"] == "extra_forbidden" and len(loc) == 1:
        return f"unknown field {loc[0]!r}; {known_names(loc[0], Sweep.model_fields)}"
    return error["msg"].removeprefix("Value error, ")  # pydantic's prefix for a ValueError


def discover_sweeps(
    folder: Path,
) -> tuple[dict[str, tuple[Sweep | None, YamlSource | None]], list[Problem]]:
    """Every sweep file of ``folder`` by name (the file's stem), with all their problems.

    Broken files are listed too (their sweep is None when nothing could be salvaged):
    ``Registry.expand`` reports a file's problems together with those its grid shows."""
    sweeps: dict[str, tuple[Sweep | None, YamlSource | None]] = {}
    problems: list[Problem] = []
    if not folder.is_dir():
        return sweeps, [Problem(str(folder), "(folder)", "sweeps folder not found")]
    listed = sorted(p for p in folder.iterdir() if p.suffix in SWEEP_SUFFIXES)
    paths = [p for p in listed if p.is_file()]
    for path in listed:
        if path.is_symlink() and not path.exists():  # skipped silently, its sweep seemed gone
            target = str(path.readlink())
            problems.append(Problem(str(path), "(file)", f"a link to {target!r}, which is missing"))
    by_stem: dict[str, list[Path]] = {}
    for path in paths:
        by_stem.setdefault(path.stem, []).append(path)
    for stem, same in by_stem.items():
        if len(same) > 1:  # which one `pdm sweep NAME` means would depend on the listing order
            names = " and ".join(p.name for p in same)
            problems += [
                Problem(str(p), "(file)", f"sweep {stem!r} is declared twice ({names}): keep one")
                for p in same
            ]
            sweeps[stem] = (None, None)
            continue
        sweep, src, errs = load_sweep_file(same[0])
        problems += errs
        sweeps[stem] = (sweep, src)
    return sweeps, problems
