"""`pdm recipes list [NAME ...] [-v]`: the methods found in the project's recipes/ folder."""

from __future__ import annotations

from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import REGISTRY, Json

COMMAND = "recipes"

app = typer.Typer(
    help="List the trust-region methods (one file each in recipes/).",
    rich_help_panel=REGISTRY,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    pass


@app.command("list")
def list_recipes(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="NAME...",
            help="Recipes to show (default: all).",
            autocompletion=_choices.complete_recipe,
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "-v", "--verbose", help="Show parameters and the sweeps that use each recipe."
        ),
    ] = False,
    json: Json = False,
) -> None:
    """List every recipe: its proximity and direction tests, the inputs it needs, its summary."""
    from pdmask.errors import ConfigError, ValidationFailed, known_names
    from pdmask.registry import load_registry

    reg = load_registry()
    unknown = [n for n in names or [] if n not in reg.recipes]
    if unknown:
        raise ConfigError(f"no recipe {', '.join(unknown)}; {known_names(unknown[0], reg.recipes)}")
    recipes = [r for r in reg.recipes.values() if not names or r.name in names]
    _show(reg, recipes, verbose=verbose, json=json)
    if reg.recipe_problems:  # the valid ones are listed; the broken ones reported, exit 2
        raise ValidationFailed(reg.recipe_problems)


def _sweeps_using(reg) -> dict[str, list[str]]:
    """The project's sweeps that train each recipe, by recipe name (what their grids expand to),
    smallest sweep first."""
    from pdmask.errors import PdmError

    sizes: dict[str, int] = {}
    methods: dict[str, set[str]] = {}
    for name in reg.sweeps:
        try:
            trials = reg.expand(name)
        except PdmError:  # a sweep that does not expand is reported by `pdm validate`
            continue
        search = reg.sweeps[name].search  # a search runs its budget, not its one planned row
        sizes[name] = search.budget if search else len(trials)
        methods[name] = {t.method for t in trials}
    used: dict[str, list[str]] = {}
    for name in sorted(sizes, key=lambda n: (sizes[n], n)):
        for method in methods[name]:
            used.setdefault(method, []).append(name)
    return used


def _brings(recipe) -> str:
    """What a recipe's file brings of its own (else the math API's tests and the standard loss)."""
    own = [part for part, fn in (("mask", recipe.mask), ("loss", recipe.loss)) if fn is not None]
    return " + ".join(own) or "-"


def _show(reg, recipes, *, verbose: bool, json: bool) -> None:
    from pdmask.console import console, print_json, table

    used = _sweeps_using(reg)
    if json:
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
                    "sweeps": used.get(r.name, []),
                    "needs": list(r.needs),
                    "verl_loss": r.verl_name,
                    "file": str(reg.recipe_files[r.name]),
                    "params": {k: p.model_dump() for k, p in r.params.items()},
                }
                for r in recipes
            ]
        )
        return
    out = console()
    rows = [
        [
            r.name,
            r.proximity or ("(own mask)" if r.mask else "-"),
            r.direction or ("(own mask)" if r.mask else "-"),
            _brings(r),
            ", ".join(r.needs) or "-",
            r.summary,
        ]
        for r in recipes
    ]
    out.print(
        table(
            f"{len(rows)} recipes in {reg.root / 'recipes'}",
            ["name", "proximity", "direction", "own", "needs", "summary"],
            rows,
            wrap={"summary"},
        )
    )
    if verbose:
        for r in recipes:
            out.print(
                f"\n[bold]{r.name}[/bold]  ({reg.recipe_files[r.name].name}, verl loss `{r.verl_name}`)"
            )
            for k, p in r.params.items():
                out.print(f"  {k} = {p.default!r}: {p.description}")
            sweeps = used.get(r.name)
            out.print(
                f"  used by: {', '.join(sweeps)} (pdm sweep {sweeps[0]})"
                if sweeps
                else f"  used by no sweep: add `{r.name}` to a sweep's `method` axis to train it"
            )
            if r.launch:
                out.print(f"  launch: {r.launch}")
