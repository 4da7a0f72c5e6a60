"""`pdm sweeps list`: the named sweeps of the project's sweeps/ folder."""

from __future__ import annotations

import typer

from pdmask.cli._options import REGISTRY, Json

COMMAND = "sweeps"

COLUMNS = ["name", "kind", "backend", "profile", "seeds", "figures", "description"]

app = typer.Typer(
    help="List the named sweeps (sweeps/*.yaml).", rich_help_panel=REGISTRY, add_completion=False
)


@app.callback()
def _group() -> None:
    pass


@app.command("list")
def list_sweeps(json: Json = False) -> None:
    """List every sweep: grid or search, backend, profile, seeds, figures, description."""
    from pdmask.console import console, print_json, table
    from pdmask.registry import load_registry

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
    if json:
        print_json([dict(zip(COLUMNS, r, strict=True)) for r in rows])
        return
    out = console()
    out.print(
        table(f"{len(rows)} sweeps in {reg.root / 'sweeps'}", COLUMNS, rows, wrap={"description"})
    )
    if reg.sweep_problems:
        out.print(
            f"[yellow]{len(reg.sweep_problems)} sweep file(s) have problems: run `pdm validate`[/yellow]"
        )
