"""`pdm ui`: the MLflow UI on 127.0.0.1 over the project's store; Ctrl-C stops it."""

from __future__ import annotations

import argparse
import os
import time

COMMAND = "ui"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND, help="serve the MLflow UI on 127.0.0.1 over the project's runs"
    )
    parser.add_argument("--port", type=int, default=5000, help="port (0: any free port)")
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="MLflow store (default: sqlite in the state folder)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from pdmask.tracking.ui import start_ui, stop_ui

    proc, url = start_ui(args.tracking_uri, port=args.port or None)
    print(f"MLflow UI: {url}   (Ctrl-C to stop)", flush=True)
    try:
        while proc.poll() is None:
            time.sleep(0.5)
        return proc.returncode or 1
    except KeyboardInterrupt:
        print("stopping the UI", flush=True)
        return 0
    finally:
        stop_ui(proc)
