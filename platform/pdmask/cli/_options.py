"""Options several commands share, each declared once: its flag, environment variable and help.

Use one as a parameter's annotation: ``tracking_uri: TrackingUri = None``. The value given on the
command line wins over the environment variable, which wins over the default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

# Help panels of the commands, in the order `pdm --help` shows them.
RUN, REGISTRY, RESULTS, DATA = "Run", "Registry", "Results", "Data"
PANELS = (RUN, REGISTRY, RESULTS, DATA)
# Help panels of options: the same heading for the same kind of option in every command.
SERVICES = "Services and state"
OUTPUT = "Output"


def _use_state_dir(value: Path | None) -> Path | None:
    # The state folder is read from $PDM_HOME everywhere (and by the processes pdmask starts).
    if value is not None:
        os.environ["PDM_HOME"] = str(value.expanduser().resolve())
    return value


TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        envvar="MLFLOW_TRACKING_URI",
        show_envvar=True,
        metavar="URI",
        help="MLflow store (sqlite:///PATH or http(s)://HOST). Default: the sqlite store in the "
        "state folder.",
        rich_help_panel=SERVICES,
    ),
]

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="PDM_HOME",
        show_envvar=True,
        metavar="DIR",
        callback=_use_state_dir,
        file_okay=False,
        help="Where pdmask writes (MLflow store, artifacts, checkpoints, caches, figures). "
        "Default: <project>/.pdm.",
        rich_help_panel=SERVICES,
    ),
]

RayAddress = Annotated[
    str | None,
    typer.Option(
        "--address",
        envvar="RAY_ADDRESS",
        show_envvar=True,
        metavar="URL",
        help="Ray cluster to run on (VeRL trials: its job API, http://HEAD:8265). Default: an "
        "embedded local Ray sized for this machine.",
        rich_help_panel=SERVICES,
    ),
]


def _use_token_file(value: Path | None) -> Path | None:
    # Read where every client of the cluster looks for it (orchestration/cluster/auth.py).
    if value is not None:
        os.environ["PDM_RAY_TOKEN_FILE"] = str(value.expanduser())
    return value


RayTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--ray-token-file",
        envvar="PDM_RAY_TOKEN_FILE",
        show_envvar=True,
        metavar="FILE",
        callback=_use_token_file,
        dir_okay=False,
        help="File holding the cluster's Ray auth token (RAY_AUTH_MODE=token clusters); "
        "RAY_AUTH_TOKEN wins when set. Default: RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token. "
        "Sent only to a job API that asks for it; never printed.",
        rich_help_panel=SERVICES,
    ),
]

Insecure = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Use a cluster whose job API answers without authentication (refused otherwise: "
        "anyone who reaches it can run code on the cluster).",
        rich_help_panel=SERVICES,
    ),
]

Json = Annotated[
    bool, typer.Option("--json", help="Machine-readable output.", rich_help_panel=OUTPUT)
]


def out_dir(default: str) -> typer.models.OptionInfo:
    """``--out DIR``: the folder a command writes into; ``default`` says where it goes without.
    Use as ``out: Annotated[Path | None, out_dir("<state>/data")] = None``."""
    return typer.Option(
        metavar="DIR",
        file_okay=False,
        help=f"Output folder. Default: {default}.",
        rich_help_panel=OUTPUT,
    )
