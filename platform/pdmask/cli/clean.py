"""`pdm clean [--yes]`: free the state folder of finished trials' checkpoints, old Ray sessions
and Tune folders, and the cluster checkpoint root of what finished VeRL trials no longer need.

A dry run by default: it lists what would go, with sizes and the total, and what stays and why.
``--yes`` deletes. What is safe to remove is decided in ``orchestration/cleanup.py``; nothing
outside the state folder and the checkpoint root (``PDM_VERL_CHECKPOINT_DIR``) is ever touched.
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
    """Remove finished trials' checkpoints, old Ray sessions and Tune folders, and on the cluster
    checkpoint root what finished VeRL trials no longer need (dry run unless --yes)."""
    from pdmask.backends.verl.jobs import checkpoint_root
    from pdmask.backends.verl.jobs_setup import JobSettings
    from pdmask.console import console, table
    from pdmask.orchestration.cleanup import find_leftovers, human_size, remove
    from pdmask.paths import state_dir as state_folder

    state = state_folder().resolve()
    found = find_leftovers(tracking_uri, checkpoint_root(JobSettings.from_env()))
    going = [item for item in found if item.kept is None]
    staying = [item for item in found if item.kept is not None]
    out = console()
    total = sum(item.size for item in going)
    verb = "removing" if yes else "would remove"
    rows = [
        [item.kind, _shown(item.path, state), human_size(item.size), item.note] for item in going
    ]
    folders = f"{len(going)} folder" + ("" if len(going) == 1 else "s")
    title = f"{verb} {folders} of {state}: {human_size(total)}"
    out.print(table(title, ["kind", "folder", "size", "of"], rows))
    for item in staying:
        out.print(f"kept {_shown(item.path, state)}: {item.kept}", soft_wrap=True)
    if not yes:
        if going:
            out.print(f"dry run: nothing deleted; `pdm clean --yes` frees {human_size(total)}")
        return
    freed = remove(going)
    out.print(f"freed {human_size(freed)}")


def _shown(path, state) -> str:
    """A folder of the state folder relative to it; one of the checkpoint root in full."""
    return str(path.relative_to(state)) if path.is_relative_to(state) else str(path)
