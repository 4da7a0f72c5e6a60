"""Sweeps: named grids in the project's ``sweeps/`` folder, and their expansion into trials.

A sweep file (YAML) declares its axes as a grid. A grid node is one of:

- a mapping ``{axis: [values], ...}``: the product of those axes, in order;
- ``{product: [node, ...]}``: the product of the nodes' cells;
- ``{zip: {axis: [values], ...}}``: the i-th values of every axis together (equal lengths);
- ``{union: [node, ...]}``: the cells of every node, one after the other.

Axes: ``method``, ``model``, ``precision``, ``delta``, ``mu_source``, ``params.<name>`` (a
recipe parameter) and ``sim.<knob>`` (an embedded-backend knob, ``registry/sim_knobs.py``; such
cells run on the embedded backend only). ``seeds`` is an axis too (a list, or a count n for seeds
0..n-1), crossed with the grid. ``overrides`` change cells that match a ``where`` clause. A sweep may instead declare a
``search`` (Optuna through Ray Tune): a space and a budget, optimising a named metric.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pdmask.errors import Problem
from pdmask.registry.sim_knobs import AXIS_PREFIX as SIM_AXIS_PREFIX
from pdmask.registry.yaml_source import FieldPath, YamlSource, load_yaml

AXES = ("method", "model", "precision", "delta", "mu_source")
SIM_PROFILES = ("smoke", "default", "full", "stress")  # = sim PROFILES


class Override(BaseModel):
    """Per-cell override: cells whose axes match ``where`` get the values in ``set``."""

    model_config = ConfigDict(extra="forbid")

    where: dict[str, Any] = Field(
        description="Axis values a cell must have, e.g. {method: pdm-agg}."
    )
    set: dict[str, Any] = Field(
        description="Axis values or `params.<name>` to set on matching cells."
    )


class SearchDim(BaseModel):
    """One searched axis: a float range (optionally log-scaled) or a list of choices."""

    model_config = ConfigDict(extra="forbid")

    low: float | None = Field(None, description="Lower bound of a float range.")
    high: float | None = Field(None, description="Upper bound of a float range.")
    log: bool = Field(False, description="Sample the range on a log scale.")
    choices: list[Any] | None = Field(None, description="Discrete values instead of a range.")

    @model_validator(mode="after")
    def _shape(self) -> SearchDim:
        if self.choices is None:
            if self.low is None or self.high is None:
                raise ValueError("give low and high, or choices")
            if not self.low < self.high:
                raise ValueError(f"low ({self.low}) must be below high ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError("a log-scaled range needs low > 0")
        return self


class SearchSpec(BaseModel):
    """A search sweep: Optuna (TPE) through Ray Tune picks points of ``space``."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        description="Metric to optimise (its last reported value), e.g. val-core/synth/acc/mean_at_16."
    )
    mode: Literal["max", "min"] = Field("max", description="Maximise or minimise the metric.")
    budget: int = Field(ge=1, description="Number of trials to run.")
    space: dict[str, SearchDim] = Field(description="Searched axes (`delta`, `params.<name>`).")
    base: dict[str, Any] = Field(
        description="Fixed values of every other axis (method, model, precision, ...)."
    )


class Sweep(BaseModel):
    """A named set of trials (a grid or a search), its budget and the figures it feeds."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Sweep name: `pdm sweep NAME`; also the MLflow experiment.")
    description: str = Field(description="What the sweep reproduces or tests.")
    figures: list[str] = Field(
        default_factory=list, description="Dashboards built when it finishes."
    )
    backend: Literal["sim", "verl"] = Field(
        "sim", description="Default backend (`--backend` overrides)."
    )
    profile: str = Field(
        "default", description=f"Embedded-backend budget profile: {list(SIM_PROFILES)}."
    )
    steps: int | None = Field(
        None, ge=1, description="RL steps per trial on VeRL (None: the backend default)."
    )
    cluster: str = Field(
        "h20x32", description="Cluster profile for planning (`--cluster` overrides)."
    )
    seeds: list[int] | int = Field(2, description="Seeds: a list, or a count n for seeds 0..n-1.")
    grid: dict[str, Any] | None = Field(
        None, description="The grid of axes (see the module docstring)."
    )
    overrides: list[Override] = Field(default_factory=list, description="Per-cell overrides.")
    search: SearchSpec | None = Field(None, description="A search instead of a grid.")
    max_concurrent: int | None = Field(None, ge=1, description="Cap on trials running at once.")
    retries: int = Field(2, ge=0, description="Retries of a crashed trial before it stays FAILED.")

    @model_validator(mode="after")
    def _grid_or_search(self) -> Sweep:
        if (self.grid is None) == (self.search is None):
            raise ValueError("declare exactly one of `grid` and `search`")
        return self

    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


# A cell maps axis -> (value, field path in the file) so errors can point at the value's line.
Cell = dict[str, tuple[Any, FieldPath]]


def expand_grid(node: Any, path: FieldPath, problems: list[Problem], src: YamlSource) -> list[Cell]:
    if not isinstance(node, dict) or not node:
        problems.append(src.problem(path, "a grid node must be a non-empty mapping"))
        return []
    keys = set(node)
    if keys == {"product"} or keys == {"union"}:
        (kind,) = keys
        children = node[kind]
        if not isinstance(children, list) or not children:
            problems.append(src.problem((*path, kind), "expects a non-empty list of grid nodes"))
            return []
        parts = [expand_grid(c, (*path, kind, i), problems, src) for i, c in enumerate(children)]
        if kind == "union":
            return [cell for part in parts for cell in part]
        return [_merge(combo, path, problems, src) for combo in itertools.product(*parts)]
    if keys == {"zip"}:
        axes = node["zip"]
        if not isinstance(axes, dict) or not axes:
            problems.append(src.problem((*path, "zip"), "expects a mapping of axis -> list"))
            return []
        lengths = {a: len(v) if isinstance(v, list) else -1 for a, v in axes.items()}
        if len(set(lengths.values())) != 1 or -1 in lengths.values():
            problems.append(
                src.problem((*path, "zip"), f"zip needs lists of equal length, got {lengths}")
            )
            return []
        n = next(iter(lengths.values()))
        return [
            {
                a: (axes[a][i], (*path, "zip", a, i))
                for a in axes
                if _axis_ok(a, (*path, "zip", a), problems, src)
            }
            for i in range(n)
        ]
    cells: list[Cell] = [{}]
    for axis, values in node.items():
        if not _axis_ok(axis, (*path, axis), problems, src):
            continue
        if not isinstance(values, list) or not values:
            values = [values]
            paths = [(*path, axis)]
        else:
            paths = [(*path, axis, i) for i in range(len(values))]
        cells = [{**c, axis: (v, p)} for c in cells for v, p in zip(values, paths, strict=True)]
    return cells


def _axis_ok(axis: str, path: FieldPath, problems: list[Problem], src: YamlSource) -> bool:
    for prefix in ("params.", SIM_AXIS_PREFIX):
        if axis.startswith(prefix) and len(axis) > len(prefix):
            return True
    if axis in AXES:
        return True
    problems.append(
        src.problem(
            path, f"unknown axis {axis!r}; known: {list(AXES)}, params.<name> or sim.<knob>"
        )
    )
    return False


def _merge(
    parts: tuple[Cell, ...], path: FieldPath, problems: list[Problem], src: YamlSource
) -> Cell:
    merged: Cell = {}
    for part in parts:
        for axis, value in part.items():
            if axis in merged and merged[axis][0] != value[0]:
                problems.append(src.problem(value[1], f"axis {axis!r} is set twice in one product"))
            merged[axis] = value
    return merged


def load_sweep_file(path: Path) -> tuple[Sweep | None, YamlSource | None, list[Problem]]:
    src, problem = load_yaml(path)
    if problem is not None:
        return None, None, [problem]
    if not isinstance(src.data, dict):
        return None, src, [src.problem((), "a sweep file must be a mapping")]
    try:
        sweep = Sweep.model_validate(src.data)
    except ValidationError as err:
        return (
            None,
            src,
            [
                src.problem(tuple(e["loc"]), e["msg"].removeprefix("Value error, "))
                for e in err.errors()
            ],
        )
    if sweep.name != path.stem:
        return sweep, src, [src.problem(("name",), f"must match the file name {path.stem!r}")]
    return sweep, src, []


def discover_sweeps(folder: Path) -> tuple[dict[str, tuple[Sweep, YamlSource]], list[Problem]]:
    sweeps: dict[str, tuple[Sweep, YamlSource]] = {}
    problems: list[Problem] = []
    if not folder.is_dir():
        return sweeps, [Problem(str(folder), "(folder)", "sweeps folder not found")]
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        sweep, src, errs = load_sweep_file(path)
        problems += errs
        if sweep is not None and not errs:
            sweeps[sweep.name] = (sweep, src)
    return sweeps, problems
