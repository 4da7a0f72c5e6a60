"""`pdm ui [SWEEP]`: the MLflow UI on 127.0.0.1 over the project's store; Ctrl-C stops it.

It prints the link to each sweep's runs table and, under it, one link per setting of the sweep
(model x precision x delta) to its comparison view (``tracking/comparison_view.py``): that
setting's runs grouped by method, the headline metric's chart first with each method's band. The
server and its helpers stop with the command,
whether it is stopped by Ctrl-C, SIGTERM or SIGKILL.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import RESULTS, SERVICES, StateDir, TrackingUri

COMMAND = "ui"

app = typer.Typer(add_completion=False)


class _Stop(Exception):
    """SIGTERM or SIGHUP: stop the server the way Ctrl-C does."""


def _raise_stop(_signum, _frame):
    raise _Stop


@app.command(rich_help_panel=RESULTS)
def ui(
    sweep: Annotated[
        str | None,
        typer.Argument(
            metavar="SWEEP",
            help="Sweep whose runs table to link (default: every experiment in the store).",
            autocompletion=_choices.complete_sweep,
            show_default=False,
        ),
    ] = None,
    port: Annotated[int, typer.Option(min=0, help="Port (0: any free port).")] = 5000,
    host: Annotated[
        str,
        typer.Option(
            help="Interface to listen on. Anything but loopback exposes the store, unauthenticated, "
            "to the network.",
            rich_help_panel=SERVICES,
        ),
    ] = "127.0.0.1",
    tracking_uri: TrackingUri = None,
    state_dir: StateDir = None,
) -> None:
    """Serve the MLflow UI on 127.0.0.1 over the project's runs."""
    from mlflow.exceptions import MlflowException

    from pdmask.errors import ConfigError
    from pdmask.loopback import LOOPBACK_HOSTS
    from pdmask.tracking.comparison_view import comparison_links
    from pdmask.tracking.store import open_client, resolve_tracking_uri
    from pdmask.tracking.ui import runs_table_url, server_log, start_ui, stop_ui

    uri = resolve_tracking_uri(tracking_uri)
    client = open_client(uri)
    experiments = [e for e in client.search_experiments() if e.name != "Default"]
    if sweep is not None:
        known = ", ".join(sorted(e.name for e in experiments)) or "(none)"
        experiments = [e for e in experiments if e.name == sweep]
        if not experiments:
            raise ConfigError(f"sweep {sweep!r} has no runs in {uri}; sweeps with runs: {known}")
    if host not in LOOPBACK_HOSTS:
        print(
            f"warning: --host {host} serves the whole store (runs, params, artifacts) and MLflow's "
            "REST API, which can write and delete, to anyone who reaches this port, without "
            "authentication. Prefer an SSH tunnel to 127.0.0.1 (ssh -L).",
            file=sys.stderr,
            flush=True,
        )
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # inherited from a script's background job: Ctrl-C (kill -INT) must still stop the UI
        signal.signal(signal.SIGINT, signal.default_int_handler)
    proc = None
    try:
        proc, url = start_ui(uri, port=port or None, host=host)
        print(f"MLflow UI: {url}   (Ctrl-C to stop)", flush=True)
        for exp in sorted(experiments, key=lambda e: e.name):
            print(f"  {exp.name}: {runs_table_url(url, exp.experiment_id)}", flush=True)
            try:
                links = comparison_links(client, url, exp.experiment_id)
            except MlflowException as err:  # a store that takes no tags: the table is still there
                print(f"    (no comparison views: {err.message})", file=sys.stderr, flush=True)
                links = []
            for name, link in links:
                print(f"    {name}, by method: {link}", flush=True)
        while proc.poll() is None:
            time.sleep(0.5)
        print(
            f"the MLflow UI stopped by itself (exit {proc.returncode}); its log: {server_log()}",
            file=sys.stderr,
            flush=True,
        )
        raise typer.Exit(proc.returncode or 1)
    except (KeyboardInterrupt, _Stop):
        print("stopping the UI", flush=True)
    finally:
        if proc is not None:
            stop_ui(proc)
