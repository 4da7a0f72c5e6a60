"""The `pdm` command line (typer, with rich help panels).

Each command lives in its own module of this package and exposes two names:

- ``COMMAND``: the command's name (``"sweep"``, ``"recipes"``, ...);
- ``app``: a ``typer.Typer`` holding the command (or, for ``recipes list`` and the like, a group).

Modules are discovered automatically, so adding a command never edits this file. A module is
cheap to import (heavy imports live in command bodies, and option types that need the registry
are resolved when typer builds the command), and a command is built only when it is used: `pdm
--help` lists every command from its help text without building any. Errors derived from
:class:`pdmask.errors.PdmError` are printed without a traceback and exit with their
``exit_code`` (2 for bad input); Ctrl-C exits 130; a failure of the machine (disk full, state
folder read-only or gone, sqlite reporting the same) is one line and exit 2
(``errors.environment_error``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from pdmask import __version__
from pdmask.cli._options import PANELS
from pdmask.errors import PdmError, environment_error


def command_apps() -> dict[str, typer.Typer]:
    """Every command module's typer app, by command name."""
    apps = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "COMMAND") and hasattr(module, "app"):
            apps[module.COMMAND] = module.app
    return apps


def _is_group(sub: typer.Typer) -> bool:
    # typer's own rule: one command and no callback becomes that command, anything else a group.
    return bool(
        sub.registered_callback
        or sub.info.callback
        or sub.registered_groups
        or len(sub.registered_commands) > 1
    )


def _listing(name: str, sub: typer.Typer) -> TyperCommand:
    """What `pdm --help` shows of a command (its help and panel), without building it."""
    if _is_group(sub):
        help_text, panel = sub.info.help, sub.rich_help_panel
    else:
        info = sub.registered_commands[0]
        help_text = info.help or inspect.getdoc(info.callback)
        panel = info.rich_help_panel
    return TyperCommand(name=name, help=_given(help_text), rich_help_panel=_given(panel))


def _panel_rank(listing: TyperCommand) -> int:
    panel = listing.rich_help_panel
    return PANELS.index(panel) if panel in PANELS else len(PANELS)  # the rest under "Commands"


def _given(value) -> str | None:
    return value if isinstance(value, str) else None  # typer keeps "not given" as a placeholder


class Commands(TyperGroup):
    """The root group: lists every command, builds one only when it runs, completes or helps.

    Building a command evaluates its option types, and some (backends, profiles, clusters) are
    read from the registry; `pdm --help` and `pdm recipes list` stay fast because nothing else is
    built. Also where pdmask's errors and Ctrl-C become exit codes.
    """

    def __init__(self, **attrs):
        super().__init__(**attrs)
        self._unbuilt = command_apps()
        listings = [_listing(name, sub) for name, sub in self._unbuilt.items()]
        for listing in sorted(listings, key=_panel_rank):
            self.commands[listing.name] = listing  # `pdm --help` shows the panels in this order

    def resolve_command(self, ctx, args):
        if args and args[0] in self._unbuilt:
            built = typer.main.get_command(self._unbuilt.pop(args[0]))
            built.name = args[0]
            self.commands[args[0]] = built
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PdmError as err:
            from pdmask.orchestration.cluster.auth import scrub  # the Ray token is never printed

            print(f"error: {scrub(str(err))}", file=sys.stderr)
            raise typer.Exit(err.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except Exception as err:  # the machine's failure, not pdmask's: one line (PDM_DEBUG: all)
            line = environment_error(err)
            if line is None or os.environ.get("PDM_DEBUG"):
                raise
            print(f"error: {line}", file=sys.stderr)
            raise typer.Exit(2) from None


app = typer.Typer(
    name="pdm",
    cls=Commands,
    help="pdmask: run, reproduce and extend LLM RL research on trust-region masks.",
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,  # locals may hold tokens and URIs with passwords
)


def _print_version(value: bool) -> None:
    if value:
        print(f"pdmask {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit()


def main(argv: list[str] | None = None) -> None:
    """The console script `pdm` (and `python -m pdmask`); always exits (SystemExit)."""
    try:  # a Ctrl-C while the commands are imported is an interrupt too, not a traceback
        app(args=argv, prog_name="pdm")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
