"""`pdm schema [--out DIR] [--check]`: JSON Schemas of the YAML forms, for editor completion.

The schemas are the pydantic models' (``Sweep``, ``FigureSpec``) with the project's names filled
in: the recipes of its ``recipes/``, the catalog's models and precisions, its sweeps and
dashboards (see ``registry/sweep_schema.py``), so they are written per project. The project's own
are committed in ``schemas/``, and every sweep and dashboard names its schema on its first line
(``# yaml-language-server: $schema=../schemas/<form>.schema.json``): ``pdm schema`` puts that line
first in every file of the project that lacks it.

A user's own recipe or sweep is not in the committed schemas until ``pdm schema`` runs (an
editor does not complete its name before), and that changes no test's verdict: the tests hold
the committed schemas to the files they name (``named_files``), and ``--check`` (CI's) to every
file of the project, so the project's own files are never stale.
"""

from __future__ import annotations

import json
import sys
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


FORMS = {"sweep": "sweeps", "dashboard": "dashboards"}  # schema name -> folder of its files


def schema_line(form: str) -> str:
    """The first line of every ``form`` file (a sweep or a dashboard): where its schema is."""
    return f"# yaml-language-server: $schema=../schemas/{form}.schema.json"


def schemas(root: Path | None = None, only: dict[str, list[str]] | None = None) -> dict[str, dict]:
    """Every form's schema for the project at ``root`` (default: the project root), by form;
    ``only``: with these of its recipes, sweeps and dashboards alone (``project_names``)."""
    from pdmask.registry import load_registry
    from pdmask.registry.sweep_schema import project_names, sweep_json_schema

    names = project_names(load_registry(root), only)
    out = {"sweep": sweep_json_schema(names)}
    dashboard = dashboard_schema(names)
    if dashboard is not None:
        out["dashboard"] = dashboard
    return out


def schema_text(body: dict) -> str:
    """A schema file's text, as ``pdm schema`` writes it."""
    return json.dumps(body, indent=2) + "\n"


def _add_schema_lines(root: Path) -> list[Path]:
    """Put the schema line first in every sweep and dashboard file that lacks it."""
    changed = []
    for form, folder in FORMS.items():
        for path in sorted((root / folder).glob("*.yaml")):
            text = path.read_text(encoding="utf-8")
            if not text.startswith("# yaml-language-server:"):
                path.write_text(schema_line(form) + "\n" + text, encoding="utf-8")
                changed.append(path)
    return changed


@app.command(rich_help_panel=REGISTRY)
def schema(
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR", file_okay=False, help="Folder to write into. Default: <project>/schemas."
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Write nothing: exit 1 if a schema in the folder is not what this command "
            "would write (a recipe, sweep or dashboard added, renamed or removed since).",
        ),
    ] = False,
) -> None:
    """Write JSON Schemas of sweep and dashboard YAML files, with this project's names, and the
    schema line atop every sweep and dashboard that lacks it."""
    from pdmask.paths import project_root

    root = project_root()
    folder = out or root / "schemas"
    texts = {name: schema_text(body) for name, body in schemas(root).items()}
    if check:
        stale = [
            folder / f"{name}.schema.json"
            for name, text in texts.items()
            if not (folder / f"{name}.schema.json").is_file()
            or (folder / f"{name}.schema.json").read_text() != text
        ]
        for path in stale:
            print(f"{path} is stale: run `pdm schema`", file=sys.stderr)
        if stale:
            raise typer.Exit(1)
        print(f"{folder}: current")
        return
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        path = folder / f"{name}.schema.json"
        path.write_text(text)
        print(f"wrote {path}")
    if folder.resolve() == (root / "schemas").resolve():  # the files' line names this folder
        for path in _add_schema_lines(root):
            print(f"added the schema line to {path}")
