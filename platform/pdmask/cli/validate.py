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
            metavar="SWEEP|KEY=VALUE",
            help="Sweeps to expand (default: all), and overrides applied to each of them as "
            "`pdm sweep NAME KEY=VALUE` applies them (e.g. `main-figure precision=bf16`).",
            autocompletion=_choices.complete_sweep,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Validate recipes and sweeps; report every problem at once (exit 2)."""
    from pdmask.console import console
    from pdmask.errors import Problem, ValidationFailed
    from pdmask.orchestration.preflight import validate_sweeps
    from pdmask.registry import load_registry
    from pdmask.registry.cli_overrides import COMMAND_LINE, with_overrides

    names = [word for word in sweeps or [] if "=" not in word]
    overrides = [word for word in sweeps or [] if "=" in word]
    if overrides and not names:
        problem = "overrides apply to the sweeps named before them: name at least one"
        raise ValidationFailed([Problem(COMMAND_LINE, " ".join(overrides), problem)])
    reg = load_registry()
    for name in names:
        reg = with_overrides(reg, name, overrides)
    counts = validate_sweeps(reg, names or None)
    out = console()
    out.print(f"{len(reg.recipes)} recipes, {len(reg.sweeps)} sweeps: all valid")
    for name, n in counts.items():
        out.print(f"  {name}: {n} trial(s)")
