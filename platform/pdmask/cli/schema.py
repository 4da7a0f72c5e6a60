"""`pdm schema [--out DIR]`: JSON Schemas of the YAML forms, for editor completion.

The schemas are the pydantic models' (``Sweep``, ``FigureSpec``) with the project's names filled
in: the recipes of its ``recipes/``, the catalog's models and precisions, its dashboards (see
``registry/sweep_schema.py``), so they are written per project. The project's own are committed
in ``schemas/``; every shipped sweep and dashboard names its schema on its first line
(``# yaml-language-server: $schema=../schemas/<form>.schema.json``) and a test checks that the
committed files equal what this command writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pdmask.cli._options import REGISTRY

COMMAND = "schema"

app = typer.Typer(add_completion=False)


def dashboard_schema(names: dict[str, list[str]]) -> dict[str, Any] | None:
    """``FigureSpec``'s schema with the project's recipes, models and precisions (None where the
    figures package is not installed)."""
    try:  # dashboards are described by the figures package
        from pdmask.figures.spec import FigureSpec
    except ImportError:
        return None
    from pdmask.registry import BACKENDS
    from pdmask.registry.sweep_schema import SCHEMA_DIALECT, axis_values, retype

    schema = {"$schema": SCHEMA_DIALECT, **FigureSpec.model_json_schema()}
    method = axis_values(names)["method"]
    top, paired, panel = (
        ("properties",),
        ("$defs", "PairedSpec", "properties"),
        ("$defs", "PanelSpec", "properties"),
    )
    retype(schema, (*top, "methods"), items=method)
    retype(schema, (*top, "linestyles"), propertyNames=method)
    retype(schema, (*top, "backend", "anyOf", 0), enum=sorted(BACKENDS))
    # A figure may read any experiment, so the project's sweeps are a hint, not a rule.
    retype(schema, (*top, "sweep"), examples=names["sweep"])
    retype(schema, (*paired, "baseline"), enum=names["method"])
    retype(schema, (*paired, "methods"), items=method)
    retype(schema, ("$defs", "ControlSpec", "properties", "method"), enum=names["method"])
    for field in ("model", "precision"):
        retype(schema, (*panel, field), enum=names[field])
    return schema


def schemas(root: Path | None = None) -> dict[str, dict]:
    """Every form's schema for the project at ``root`` (default: the project root), by form."""
    from pdmask.registry import load_registry
    from pdmask.registry.sweep_schema import project_names, sweep_json_schema

    registry = load_registry(root)
    out = {"sweep": sweep_json_schema(registry)}
    dashboard = dashboard_schema(project_names(registry))
    if dashboard is not None:
        out["dashboard"] = dashboard
    return out


@app.command(rich_help_panel=REGISTRY)
def schema(
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR", file_okay=False, help="Folder to write into. Default: <project>/schemas."
        ),
    ] = None,
) -> None:
    """Write JSON Schemas of sweep and dashboard YAML files, with this project's names."""
    from pdmask.paths import project_root

    root = project_root()
    out = out or root / "schemas"
    out.mkdir(parents=True, exist_ok=True)
    for name, body in schemas(root).items():
        path = out / f"{name}.schema.json"
        path.write_text(json.dumps(body, indent=2) + "\n")
        print(f"wrote {path}")
