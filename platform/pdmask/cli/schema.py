"""`pdm schema [--out DIR]`: JSON Schemas of the YAML forms, for editor completion."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdmask.paths import project_root
from pdmask.registry import Sweep

COMMAND = "schema"


def schemas() -> dict[str, dict]:
    out = {"sweep": Sweep.model_json_schema()}
    try:  # dashboards are described by the figures package
        from pdmask.figures.spec import FigureSpec

        out["dashboard"] = FigureSpec.model_json_schema()
    except ImportError:
        pass
    return out


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND, help="write JSON Schemas of sweep and dashboard YAML files"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder to write into (default: <project>/schemas)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    out = args.out or project_root() / "schemas"
    out.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas().items():
        path = out / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2) + "\n")
        print(f"wrote {path}")
    return 0
