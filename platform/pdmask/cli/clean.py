"""`pdm clean [--yes]`: free the state folder of finished trials' checkpoints, old Ray sessions
and Tune folders.

A dry run by default: it lists what would go, with sizes and the total, and what stays and why.
``--yes`` deletes. What is safe to remove is decided in ``orchestration/cleanup.py``; nothing
outside the state folder is ever touched.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pdmask.cli._options import RESULTS, StateDir, TrackingUri

COMMAND = "clean"

app = typer.Typer(add_completion=False)


@app.command(rich_help_panel=RESULTS)
def clean(
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", help="Delete what the dry run lists (without it nothing is deleted)."
        ),
    ] = False,
    tracking_uri: TrackingUri = None,
    state_dir: StateDir = None,
) -> None:
    """Remove finished trials' checkpoints, old Ray sessions and Tune folders (dry run unless
    --yes)."""
    from pdmask.console import console, table
    from pdmask.orchestration.cleanup import find_leftovers, human_size, remove
    from pdmask.paths import state_dir as state_folder

    state = state_folder().resolve()
    found = find_leftovers(tracking_uri)
    going = [item for item in found if item.kept is None]
    staying = [item for item in found if item.kept is not None]
    out = console()
    total = sum(item.size for item in going)
    verb = "removing" if yes else "would remove"
    rows = [
        [item.kind, str(item.path.relative_to(state)), human_size(item.size), item.note]
        for item in going
    ]
    folders = f"{len(going)} folder" + ("" if len(going) == 1 else "s")
    title = f"{verb} {folders} of {state}: {human_size(total)}"
    out.print(table(title, ["kind", "folder", "size", "of"], rows))
    for item in staying:
        out.print(f"kept {item.path.relative_to(state)}: {item.kept}", soft_wrap=True)
    if not yes:
        if going:
            out.print(f"dry run: nothing deleted; `pdm clean --yes` frees {human_size(total)}")
        return
    freed = remove(going)
    out.print(f"freed {human_size(freed)}")
