"""`pdm sweeps list`: the named sweeps of the project's sweeps/ folder."""

from __future__ import annotations

import argparse

from pdmask.cli._output import console, print_json, table
from pdmask.registry import load_registry

COMMAND = "sweeps"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(COMMAND, help="list the named sweeps (sweeps/*.yaml)")
    sub = parser.add_subparsers(metavar="ACTION", required=True)
    lister = sub.add_parser("list", help="list every sweep")
    lister.add_argument("--json", action="store_true", help="machine-readable output")
    lister.set_defaults(func=run_list)
    return parser


def run_list(args: argparse.Namespace) -> int:
    reg = load_registry()
    rows = []
    for name, sweep in reg.sweeps.items():
        kind = f"search ({sweep.search.budget} trials)" if sweep.search else "grid"
        rows.append(
            [
                name,
                kind,
                sweep.backend,
                sweep.profile,
                len(sweep.seed_list()),
                ", ".join(sweep.figures) or "-",
                sweep.description,
            ]
        )
    if args.json:
        print_json(
            [
                dict(
                    zip(
                        ["name", "kind", "backend", "profile", "seeds", "figures", "description"],
                        r,
                        strict=True,
                    )
                )
                for r in rows
            ]
        )
        return 0
    out = console()
    out.print(
        table(
            f"{len(rows)} sweeps in {reg.root / 'sweeps'}",
            ["name", "kind", "backend", "profile", "seeds", "figures", "description"],
            rows,
            wrap={"description"},
        )
    )
    if reg.sweep_problems:
        out.print(
            f"[yellow]{len(reg.sweep_problems)} sweep file(s) have problems: run `pdm validate`[/yellow]"
        )
    return 0
