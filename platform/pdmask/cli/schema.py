"""`pdm schema [--out DIR]`: JSON Schemas of the YAML forms, for editor completion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pdmask.cli._options import REGISTRY

COMMAND = "schema"

app = typer.Typer(add_completion=False)


def schemas() -> dict[str, dict]:
    from pdmask.registry import Sweep

    out = {"sweep": Sweep.model_json_schema()}
    try:  # dashboards are described by the figures package
        from pdmask.figures.spec import FigureSpec

        out["dashboard"] = FigureSpec.model_json_schema()
    except ImportError:
        pass
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
    """Write JSON Schemas of sweep and dashboard YAML files."""
    from pdmask.paths import project_root

    out = out or project_root() / "schemas"
    out.mkdir(parents=True, exist_ok=True)
    for name, body in schemas().items():
        path = out / f"{name}.schema.json"
        path.write_text(json.dumps(body, indent=2) + "\n")
        print(f"wrote {path}")
