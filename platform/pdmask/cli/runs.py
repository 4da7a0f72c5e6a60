"""`pdm runs [SWEEP] [--json]`: the runs in the tracking store, one row each.

The rows are ``pdmask.runs``' (``tracking/results.py``): the table shows run name, status,
attempts, the headline metric (final and best) and wall time; ``--json`` prints every column of
every row, for scripts.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import RESULTS, Json, StateDir, TrackingUri

COMMAND = "runs"

app = typer.Typer(add_completion=False)


@app.command(rich_help_panel=RESULTS)
def runs(
    sweep: Annotated[
        str | None,
        typer.Argument(
            metavar="SWEEP",
            help="Sweep whose runs to list (default: every sweep in the store).",
            autocompletion=_choices.complete_sweep,
            show_default=False,
        ),
    ] = None,
    json: Json = False,
    tracking_uri: TrackingUri = None,
    state_dir: StateDir = None,
) -> None:
    """List the runs of a sweep: status, attempts, headline metric, wall time."""
    from pdmask.console import console, print_json, table
    from pdmask.tracking.metric_names import HEADLINE_PATTERN
    from pdmask.tracking.results import run_rows

    rows = run_rows(sweep, tracking_uri)
    if json:
        print_json(rows)
        return
    columns = ["run", "status", "attempts", "headline", "best", "wall"]
    if sweep is None:
        columns.insert(0, "sweep")
    cells = []
    for row in rows:
        cell = [
            row["run_name"],
            row["status"],
            row["attempts"],
            _number(row["headline_final"]),
            _number(row["headline_best"]),
            _duration(row["wall_s"]),
        ]
        cells.append([row["sweep"], *cell] if sweep is None else cell)
    where = f"of {sweep}" if sweep else "in the store"
    title = f"{len(rows)} runs {where} (headline: {HEADLINE_PATTERN}, final and best)"
    console().print(table(title, columns, cells))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    )
