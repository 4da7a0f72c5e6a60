"""Console output shared by the CLI and the orchestration: rich tables and JSON.

It sits below both (it imports nothing of pdmask), so the runners print the same tables as the
commands without importing the CLI.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

# Off a terminal (a pipe, a log, CI) nothing reflows the text afterwards: a table is printed as wide
# as its cells need (up to this), never with its cells cut to an assumed width.
PIPED_WIDTH = 400


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
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
