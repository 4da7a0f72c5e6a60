"""`pdm figure NAME`: draw a figure spec of ``dashboards/`` from the runs in MLflow.

    pdm figure figure-1                         # sweep main-figure, the project's MLflow store
    pdm figure figure-2 --sweep my-ablation --out paper/figs --tracking-uri http://127.0.0.1:5000
    pdm figure --list                           # the specs available

Heavy imports (MLflow, matplotlib) happen inside the command, so `pdm --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdmask.cli import _choices
from pdmask.cli._options import OUTPUT, RESULTS, StateDir, TrackingUri, out_dir

COMMAND = "figure"

app = typer.Typer(add_completion=False)


@app.command(rich_help_panel=RESULTS)
def figure(
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="NAME",
            help="Figure spec name (e.g. figure-1) or a .yaml path.",
            autocompletion=_choices.complete_dashboard,
            show_default=False,
        ),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            help="Sweep (= MLflow experiment) to read. Default: the spec's.",
            autocompletion=_choices.complete_sweep,
        ),
    ] = None,
    out: Annotated[Path | None, out_dir("<state>/figures/<sweep>/<name>")] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Re-read every metric history from MLflow.")
    ] = False,
    no_diagnostics: Annotated[
        bool,
        typer.Option(
            "--no-diagnostics",
            help="Skip the companion diagnostics figure.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    list_specs: Annotated[
        bool, typer.Option("--list", help="List the figure specs and exit.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Print only the files written.", rich_help_panel=OUTPUT)
    ] = False,
    tracking_uri: TrackingUri = None,
    state_dir: StateDir = None,
) -> None:
    """Draw a paper figure (dashboards/NAME.yaml) from the sweep's MLflow runs.

    Builds a figure from MLflow runs: PNG and PDF, the plotted data as CSV, a manifest (run ids,
    trial hashes, git SHAs, the spec) and a summary table (final and best value per method and
    setting, paired differences against the baseline).
    """
    from pdmask.cli._names import SWEEP_NAME, checked
    from pdmask.errors import ConfigError
    from pdmask.figures.spec import SPEC_SUFFIXES, available_specs, load_spec

    if list_specs:
        for spec_name in available_specs():
            spec = load_spec(spec_name)
            print(f"{spec_name:<16} sweep {spec.sweep:<16} {spec.title}")
        return
    if not name:
        raise ConfigError("give a figure name (pdm figure --list shows them)")

    if not name.endswith(SPEC_SUFFIXES):  # a spec file is given by its path, a name is a name
        checked(name, argument="NAME", kind="figure spec", known=available_specs())
    from pdmask.figures import build_figure
    from pdmask.registry import load_registry

    if sweep is not None:  # it names the output folder, <state>/figures/<sweep>/<name>
        known = load_registry().sweeps
        checked(sweep, argument="--sweep", kind="sweep", known=known, pattern=SWEEP_NAME)

    # styles=None: build_figure takes them from the recipe registry, else a fixed palette.
    result = build_figure(
        name,
        sweep=sweep,
        tracking_uri=tracking_uri,
        out_dir=out,
        use_cache=not no_cache,
        diagnostics=not no_diagnostics,
    )
    if not quiet:
        print(result.summary_markdown)
        for note in result.notes:
            print(f"note: {note}")
        stats = result.stats
        print(
            f"{result.name}: {stats['runs']} runs from sweep {result.sweep} "
            f"({stats['fetched']} histories fetched, {stats['cached']} from cache) "
            f"in {stats['seconds']:.1f} s"
        )
    for role, path in result.paths.items():
        print(f"{role:<16} {path}")
