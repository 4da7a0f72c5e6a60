"""`pdm validate [SWEEP ...]`: check every recipe and sweep (expanding each grid); all errors at once."""

from __future__ import annotations

import argparse

from pdmask.cli._output import console
from pdmask.errors import ValidationFailed
from pdmask.registry import load_registry
from pdmask.registry.recipe_check import check_recipes

COMMAND = "validate"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND, help="validate recipes and sweeps; report every problem at once"
    )
    parser.add_argument("sweeps", nargs="*", help="sweeps to expand (default: all)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    reg = load_registry()
    problems = list(reg.problems)
    names = args.sweeps or sorted(reg.sweeps)
    counts, trials = {}, []
    for name in names:
        try:
            trials += reg.expand(name)
            counts[name] = len(trials) - sum(counts.values())
        except ValidationFailed as err:
            problems += [p for p in err.problems if p not in problems]
    # Every recipe's mask and loss on synthetic batches of each backend's layout.
    problems += [p for p in check_recipes(reg.recipes, trials) if p not in problems]
    if problems:
        raise ValidationFailed(problems)
    out = console()
    out.print(f"{len(reg.recipes)} recipes, {len(reg.sweeps)} sweeps: all valid")
    for name, n in counts.items():
        out.print(f"  {name}: {n} trial(s)")
    return 0
