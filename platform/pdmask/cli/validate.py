"""`pdm validate [SWEEP ...]`: check every recipe and sweep (expanding each grid); all errors at once."""

from __future__ import annotations

import argparse

from pdmask.cli._output import console
from pdmask.registry import load_registry

COMMAND = "validate"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND, help="validate recipes and sweeps; report every problem at once"
    )
    parser.add_argument("sweeps", nargs="*", help="sweeps to expand (default: all)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from pdmask.orchestration.preflight import validate_sweeps

    reg = load_registry()
    counts = validate_sweeps(reg, args.sweeps or None)
    out = console()
    out.print(f"{len(reg.recipes)} recipes, {len(reg.sweeps)} sweeps: all valid")
    for name, n in counts.items():
        out.print(f"  {name}: {n} trial(s)")
    return 0
