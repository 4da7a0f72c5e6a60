"""The `pdm` command line.

Each sub-command lives in its own module of this package and exposes two names:

- ``COMMAND``: the sub-command's name (``"sweep"``, ``"recipes"``, ...);
- ``add_parser(subparsers) -> argparse.ArgumentParser``: declares its arguments and sets
  ``func=<handler>`` on the parser; the handler takes the parsed ``argparse.Namespace`` and
  returns an exit code.

Modules are discovered automatically, so adding a command never edits this file.
Errors derived from :class:`pdmask.errors.PdmError` are printed without a traceback and exit
with their ``exit_code`` (2 for bad input).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from pdmask import __version__
from pdmask.errors import PdmError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdm",
        description="pdmask: run, reproduce and extend LLM RL research on trust-region masks.",
    )
    parser.add_argument("--version", action="version", version=f"pdmask {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "COMMAND") and hasattr(module, "add_parser"):
            module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    try:  # a Ctrl-C while the commands are imported is an interrupt too, not a traceback
        parser = build_parser()
        args = parser.parse_args(argv)
        if not hasattr(args, "func"):
            parser.print_help()
            sys.exit(0)
        code = args.func(args)
    except PdmError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
