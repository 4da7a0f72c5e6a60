"""`pdm logs RUN`: print a trial's log from the state folder (``<state>/logs/<sweep>/<run>.<hash>.log``).

    pdm logs pdm-agg-qwen3-4b-base-bf16-d0.15-s0          # by run name
    pdm logs 3f2a9c1d --sweep main-figure                 # by trial-hash prefix, in one sweep
    pdm logs pdm-agg-qwen3-4b-base-bf16-d0.15-s0 -f       # and follow it until its run ends

The log holds every attempt's stdout and stderr, each after a header line naming the attempt.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import RESULTS, StateDir, TrackingUri

COMMAND = "logs"

FOLLOW_POLL_S = 0.5  # how often --follow looks for new lines
STATUS_POLL_S = 2.0  # how often it asks the store whether the run has ended

app = typer.Typer(add_completion=False)


@app.command(rich_help_panel=RESULTS)
def logs(
    run: Annotated[
        str,
        typer.Argument(
            metavar="RUN", help="Run name, or a prefix of the trial hash.", show_default=False
        ),
    ],
    sweep: Annotated[
        str | None,
        typer.Option(
            metavar="SWEEP",
            help="Look in this sweep's logs only (when two sweeps have a run of that name).",
            autocompletion=_choices.complete_sweep,
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing new lines until the run ends (Ctrl-C stops)."
        ),
    ] = False,
    tracking_uri: TrackingUri = None,
    state_dir: StateDir = None,
) -> None:
    """Print a trial's log: its stdout and stderr, every attempt."""
    from pdmask.cli._names import HASH_PREFIX, checked
    from pdmask.errors import ConfigError, known_names
    from pdmask.orchestration import trial_logs

    # Both are matched against the log folder's names before any log is opened.
    if sweep is not None:
        checked(sweep, argument="--sweep", kind="sweep with logs", known=trial_logs.sweeps())
    logs = trial_logs.all_logs(sweep)
    known = sorted({trial_logs.run_name_of(p) for p in logs})
    # a log's file name (run name and hash) names it too, but only the run names are offered
    names = [*known, *(p.stem for p in logs)]
    checked(
        run, argument="RUN", kind="run with a log", known=names, pattern=HASH_PREFIX, listed=known
    )
    found = trial_logs.find(run, sweep)
    if not found:
        where = f"sweep {sweep!r}" if sweep else "any sweep"
        raise ConfigError(f"no log in {where} has a trial hash {run}...; {known_names(run, known)}")
    if len(found) > 1:
        logs = ", ".join(f"{p.parent.name}/{p.name}" for p in found)
        raise ConfigError(
            f"{run!r} names more than one trial's log ({logs}): give the trial-hash prefix "
            "the file name holds, or --sweep"
        )
    (path,) = found
    offset = _print_from(path, 0)
    if follow:
        _follow(path, offset, trial_logs.run_id(path), tracking_uri)


def _print_from(path: Path, offset: int) -> int:
    """Print what ``path`` holds past ``offset``, credentials hidden; the new offset. A log
    shorter than ``offset`` was cut to its cap as an attempt ended: it goes on from the same byte
    in the cut file."""
    from pdmask.console import redact
    from pdmask.orchestration import trial_logs

    if path.stat().st_size < offset:
        offset = trial_logs.offset_after_cut(path, offset)
    with path.open("rb") as log:
        log.seek(offset)
        data = log.read()
    sys.stdout.write(redact(data.decode(errors="replace")))  # a log older than the rule's
    sys.stdout.flush()
    return offset + len(data)


def _follow(path: Path, offset: int, run_id: str | None, tracking_uri: str | None) -> None:
    """New lines until the run is no longer RUNNING (a run between two attempts is RUNNING), or
    forever for a log without a run; Ctrl-C ends it (exit 130, as for every command)."""
    ended = _run_ended(run_id, tracking_uri)
    checked = 0.0
    while True:
        offset = _print_from(path, offset)
        if time.monotonic() - checked >= STATUS_POLL_S:
            checked = time.monotonic()
            if ended():
                _print_from(path, offset)  # what the attempt wrote as it ended
                return
        time.sleep(FOLLOW_POLL_S)


def _run_ended(run_id: str | None, tracking_uri: str | None):
    if run_id is None:
        return lambda: False
    from pdmask.tracking import open_client
    from pdmask.tracking.store import resolve_tracking_uri

    client = open_client(resolve_tracking_uri(tracking_uri), integrity=False)

    def ended() -> bool:
        try:
            return client.get_run(run_id).info.status != "RUNNING"
        except Exception:  # a run this store does not hold (another --tracking-uri): no end known
            return False

    return ended
