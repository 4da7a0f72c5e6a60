"""The sweep file's JSON Schema with the project's own names, for editors (``pdm schema``).

``Sweep.model_json_schema()`` types ``grid`` as any mapping (its grammar is checked by
``sweeps.iter_cells``, which names the file and line of each problem), so an editor could complete
nothing in it. ``sweep_json_schema`` fills in that grammar (``sweeps``' module docstring: axes,
``product``, ``zip``, ``union``) and the names each axis takes, read from their one home each:

- ``method``: the project's recipes (``recipes/``, as discovered: a schema is per project);
- ``model``, ``precision``: the catalog (``registry/catalog.py``); ``mu_source``: ``Trial``'s type;
- ``params.<name>``: a parameter of any of the project's recipes; ``sim.<knob>``: ``SimKnobs``;
- the sweep's ``profile``, ``cluster`` and ``figures`` (the project's dashboards).

The same axis values type the overrides' ``where``/``set`` and a search's ``base``/``space``. The
schema only helps an editor: ``Registry.expand`` stays the check that decides (a value the schema
allows, such as a parameter of another recipe, is still refused there, with its line).
Every keyword used here means the same in JSON Schema draft 7 (what most YAML editors implement)
and 2020-12 (what pydantic emits).
"""

from __future__ import annotations

import typing
from collections.abc import Collection
from typing import Any

from pdmask.registry.backends import BACKENDS
from pdmask.registry.catalog import CLUSTERS, MODELS, PRECISIONS
from pdmask.registry.registry import Registry
from pdmask.registry.sim_knobs import AXIS_PREFIX as SIM_AXIS_PREFIX
from pdmask.registry.sim_knobs import SimKnobs
from pdmask.registry.sweeps import SIM_PROFILES, Sweep
from pdmask.registry.trial import Trial

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCALAR = {"type": ["string", "number", "boolean", "null"]}  # = sweeps.value_problem


def project_names(
    registry: Registry, only: dict[str, Collection[str]] | None = None
) -> dict[str, list[str]]:
    """The names a sweep or dashboard file may use in this project, sorted (stable files).
    ``only``: keep only these of the project's recipes (``method``), sweeps and dashboards (the
    names a committed schema holds: the shipped files, whatever a user added since)."""
    recipes = {n: r for n, r in registry.recipes.items() if only is None or n in only["method"]}
    sweeps = {*registry.sweeps, *registry.broken_sweeps}
    return {
        "method": sorted(recipes),
        "model": sorted(MODELS),
        "precision": sorted(PRECISIONS),
        "mu_source": list(typing.get_args(Trial.model_fields["mu_source"].annotation)),
        "backend": sorted(BACKENDS),
        "param": sorted({p for recipe in recipes.values() for p in recipe.params}),
        "sweep": sorted(n for n in sweeps if only is None or n in only["sweep"]),
        "dashboard": sorted(
            n for n in registry.dashboards if only is None or n in only["dashboard"]
        ),
    }


def named_files(schemas: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The recipes, sweeps and dashboards the schemas (``{"sweep": ..., "dashboard": ...}``, as
    ``pdm schema`` wrote them) name: what the project shipped when they were written."""
    sweep = schemas.get("sweep", {})
    return {
        "method": sweep.get("$defs", {}).get("Axis.method", {}).get("enum", []),
        "sweep": schemas.get("dashboard", {})
        .get("properties", {})
        .get("sweep", {})
        .get("examples", []),
        "dashboard": sweep.get("properties", {})
        .get("figures", {})
        .get("items", {})
        .get("enum", []),
    }


def enum(names: list[str], description: str) -> dict[str, Any]:
    return {"type": "string", "enum": names, "description": description}


def axis_values(names: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """The schema of one value of each axis, by axis name."""
    knobs = {
        f"{SIM_AXIS_PREFIX}{knob}": {k: v for k, v in body.items() if k not in ("title", "default")}
        for knob, body in SimKnobs.model_json_schema()["properties"].items()
    }
    return {
        "method": enum(names["method"], "A recipe of recipes/ (`pdm recipes list`)."),
        "model": enum(names["model"], "A model of the catalog (registry/catalog.py)."),
        "precision": enum(names["precision"], "A precision setting (registry/catalog.py)."),
        "delta": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "Trust-region size: sets the parameter of the `delta` role.",
        },
        "mu_source": enum(names["mu_source"], "Where the behaviour policy's top-K comes from."),
        "backend": enum(
            names["backend"], "The one backend this cell runs on (left out under any other)."
        ),
        **{
            f"params.{p}": {**SCALAR, "description": f"Recipe parameter `{p}`."}
            for p in names["param"]
        },
        **knobs,
    }


def _mapping(properties: dict[str, Any], description: str) -> dict[str, Any]:
    """A non-empty mapping of only these keys (a misspelled axis is refused, not ignored)."""
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "additionalProperties": False,
        "minProperties": 1,
    }


def _list_of(item: dict[str, Any], unique: bool) -> dict[str, Any]:
    return {
        "type": "array",
        "minItems": 1,
        "items": item,
        **({"uniqueItems": True} if unique else {}),
    }


def axis_ref(axis: str) -> dict[str, str]:
    """A reference to one value of ``axis`` (each axis's values are defined once, in ``$defs``)."""
    return {"$ref": f"#/$defs/Axis.{axis}"}


def grid_defs(values: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``$defs`` of the grid grammar (a node is axes, a product, a zip or a union) and of one
    value of each axis."""
    node = {"$ref": "#/$defs/GridNode"}

    def combinator(key: str, description: str) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {key: {**_list_of(node, unique=False), "description": description}},
            "required": [key],
            "additionalProperties": False,
        }

    return {
        **{f"Axis.{axis}": value for axis, value in values.items()},
        "GridNode": {
            "description": "A grid node: axes (their product), or one of product / zip / union.",
            "anyOf": [
                {"$ref": "#/$defs/GridAxes"},
                combinator("product", "The product of the nodes' cells."),
                {"$ref": "#/$defs/GridZip"},
                combinator("union", "The cells of every node, one after the other."),
            ],
        },
        "GridAxes": _mapping(
            {  # a product's axis may not repeat a value (sweeps._checked_values)
                axis: {"anyOf": [axis_ref(axis), _list_of(axis_ref(axis), unique=True)]}
                for axis in values
            },
            "Axes and their values (one value or a list): the product of the axes, in order.",
        ),
        "GridZip": {
            "type": "object",
            "properties": {
                "zip": _mapping(
                    {axis: _list_of(axis_ref(axis), unique=False) for axis in values},
                    "Axes and lists of equal length: the i-th values of every axis together.",
                )
            },
            "required": ["zip"],
            "additionalProperties": False,
        },
    }


def retype(schema: dict[str, Any], path: tuple[str | int, ...], **changes: Any) -> None:
    """Update the node at ``path`` of a model's ``schema``: a path the model no longer has is an
    error of ``pdm schema`` (and of its test), not a schema that silently stops completing."""
    node = schema
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            raise KeyError(
                f"the {schema.get('title')} schema has no {'.'.join(map(str, path))}: the model "
                "changed; update what `pdm schema` fills in"
            ) from None
    node.update(changes)


def sweep_json_schema(names: dict[str, list[str]]) -> dict[str, Any]:
    """The JSON Schema of sweep files using ``names`` (``project_names``; the module docstring)."""
    values = axis_values(names)
    schema = {"$schema": SCHEMA_DIALECT, **Sweep.model_json_schema()}
    schema["$defs"].update(grid_defs(values))
    props = ("properties",)
    retype(schema, (*props, "grid"), anyOf=[{"$ref": "#/$defs/GridNode"}, {"type": "null"}])
    retype(schema, (*props, "profile"), enum=list(SIM_PROFILES))
    retype(schema, (*props, "cluster"), enum=sorted(CLUSTERS))
    retype(schema, (*props, "figures", "items"), enum=names["dashboard"])
    single = {
        "properties": {axis: axis_ref(axis) for axis in values},
        "additionalProperties": False,
    }
    for field in ("where", "set"):
        retype(schema, ("$defs", "Override", *props, field), **single)
    retype(schema, ("$defs", "SearchSpec", *props, "base"), **single)
    retype(
        schema,
        ("$defs", "SearchSpec", *props, "space"),
        properties={axis: {"$ref": "#/$defs/SearchDim"} for axis in values},
        additionalProperties=False,
    )
    return schema
