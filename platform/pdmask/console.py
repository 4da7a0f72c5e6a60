"""Console output shared by the CLI and the orchestration: rich tables and JSON, and the one
redaction rule every writer applies (``redact``).

It sits below both (it imports nothing of pdmask), so the runners print the same tables as the
commands without importing the CLI.

No credential leaves pdmask: a URI's password (``scheme://user:PASSWORD@host``) and the value of
a secret variable (``MLFLOW_TRACKING_PASSWORD=...``, ``"RAY_AUTH_TOKEN": "..."``) are replaced
by ``***`` in everything pdmask prints or writes (the console, JSON, trial logs and their
artifacts, ``pdm logs``). Secrets reach Ray jobs and workers through their environment only.
MLflow itself prints a run's URL, password included, when a run ends: ``QUIET_MLFLOW`` is the
environment that stops it, set in every process pdmask starts or runs trials in.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

# Off a terminal (a pipe, a log, CI) nothing reflows the text afterwards: a table is printed as wide
# as its cells need (up to this), never with its cells cut to an assumed width.
PIPED_WIDTH = 400

_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^/@\s:]*):(?P<password>[^/\s]*)@")
# An upper-case variable naming a password, token or secret, then its value (as ``KEY=value``,
# ``KEY: value`` or JSON's ``"KEY": "value"``).
_SECRET_VALUE = re.compile(
    r"(?P<key>\b[A-Z][A-Z0-9_]*(?:PASSWORD|TOKEN|SECRET)[A-Z0-9_]*)"
    r"(?P<sep>[\"']?\s*[=:]\s*[\"']?)(?P<value>[^\s\"',}]+)"
)
# MLflow's "View run ... at: <tracking URI>/..." lines, off (mlflow.environment_variables)
QUIET_MLFLOW = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


def redact(text: str) -> str:
    """``text`` with every credential in it replaced by ``***``: the password of a URI and the
    value of a password, token or secret variable."""
    text = _URI_PASSWORD.sub(lambda m: f"{m['head']}:***@", text)
    return _SECRET_VALUE.sub(lambda m: f"{m['key']}{m['sep']}***", text)


def console() -> Console:
    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH, highlight=False)


def table(
    title: str, columns: list[str], rows: list[list[Any]], wrap: set[str] | None = None
) -> Table:
    """A compact table; only the columns named in ``wrap`` may wrap (long free text)."""
    wrap = wrap or set()
    t = Table(
        title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for col in columns:
        t.add_column(col, no_wrap=col not in wrap, overflow="fold")
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    return t


def print_json(data: Any) -> None:
    sys.stdout.write(redact(json.dumps(data, indent=2, default=str)) + "\n")
