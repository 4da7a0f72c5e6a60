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
    from pdmask.errors import ValidationFailed
    from pdmask.registry import load_registry
    from pdmask.registry.recipe_check import check_recipes

    reg = load_registry()
    problems = list(reg.problems)
    names = sweeps or sorted(reg.sweeps)
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
