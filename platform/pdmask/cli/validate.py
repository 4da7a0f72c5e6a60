"""`pdm validate [SWEEP ...]`: check every recipe and sweep (expanding each grid); all errors at once."""

from __future__ import annotations

from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import REGISTRY

COMMAND = "validate"

app = typer.Typer(add_completion=False)


@app.command(rich_help_panel=REGISTRY)
def validate(
    sweeps: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SWEEP...",
            help="Sweeps to expand (default: all).",
            autocompletion=_choices.complete_sweep,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Validate recipes and sweeps; report every problem at once (exit 2)."""
    from pdmask.console import console
    from pdmask.orchestration.preflight import validate_sweeps
    from pdmask.registry import load_registry

    reg = load_registry()
    counts = validate_sweeps(reg, sweeps or None)
    out = console()
    out.print(f"{len(reg.recipes)} recipes, {len(reg.sweeps)} sweeps: all valid")
    for name, n in counts.items():
        out.print(f"  {name}: {n} trial(s)")
