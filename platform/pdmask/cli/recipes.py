"""`pdm recipes list [-v]`: the methods found in the project's recipes/ folder."""

from __future__ import annotations

import argparse

from pdmask.cli._output import console, print_json, table
from pdmask.errors import ValidationFailed
from pdmask.registry import load_registry

COMMAND = "recipes"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND, help="list the trust-region methods (one file each in recipes/)"
    )
    sub = parser.add_subparsers(metavar="ACTION", required=True)
    lister = sub.add_parser("list", help="list every recipe")
    lister.add_argument(
        "-v", "--verbose", action="store_true", help="show parameters and how to launch"
    )
    lister.add_argument("--json", action="store_true", help="machine-readable output")
    lister.set_defaults(func=run_list)
    return parser


def run_list(args: argparse.Namespace) -> int:
    reg = load_registry()
    code = _list(args, reg)
    if reg.recipe_problems:  # the valid ones are listed; the broken ones reported, exit 2
        raise ValidationFailed(reg.recipe_problems)
    return code


def _list(args: argparse.Namespace, reg) -> int:
    if args.json:
        print_json(
            [
                {
                    "name": r.name,
                    "display_name": r.display_name,
                    "color": r.color,
                    "summary": r.summary,
                    "proximity": r.proximity,
                    "direction": r.direction,
                    "custom_mask": r.mask is not None,
                    "custom_loss": r.loss is not None,
                    "needs": list(r.needs),
                    "verl_loss": r.verl_name,
                    "file": str(reg.recipe_files[r.name]),
                    "params": {k: p.model_dump() for k, p in r.params.items()},
                }
                for r in reg.recipes.values()
            ]
        )
        return 0
    out = console()
    rows = [
        [
            r.name,
            r.proximity or ("(own mask)" if r.mask else "-"),
            r.direction or ("(own mask)" if r.mask else "-"),
            ", ".join(r.needs) or "-",
            r.summary,
        ]
        for r in reg.recipes.values()
    ]
    out.print(
        table(
            f"{len(rows)} recipes in {reg.root / 'recipes'}",
            ["name", "proximity", "direction", "needs", "summary"],
            rows,
            wrap={"summary"},
        )
    )
    if args.verbose:
        for r in reg.recipes.values():
            out.print(
                f"\n[bold]{r.name}[/bold]  ({reg.recipe_files[r.name].name}, verl loss `{r.verl_name}`)"
            )
            for k, p in r.params.items():
                out.print(f"  {k} = {p.default!r}: {p.description}")
            out.print(f"  launch: {r.launch}")
    return 0
