"""`pdm figure NAME`: draw a figure spec of ``dashboards/`` from the runs in MLflow.

    pdm figure figure-1                         # sweep main-figure, the project's MLflow store
    pdm figure figure-2 --sweep my-ablation --out paper/figs --tracking-uri http://127.0.0.1:5000
    pdm figure --list                           # the specs available

Heavy imports (MLflow, matplotlib) happen inside the handler, so `pdm --help` stays fast.
"""

from __future__ import annotations

import argparse

COMMAND = "figure"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND,
        help="draw a paper figure (dashboards/NAME.yaml) from the sweep's MLflow runs",
        description="Build a figure from MLflow runs: PNG and PDF, the plotted data as CSV, a "
        "manifest (run ids, trial hashes, git SHAs, the spec) and a summary table (final and "
        "best value per method and setting, paired differences against the baseline).",
    )
    parser.add_argument("name", nargs="?", help="figure spec name (e.g. figure-1) or a .yaml path")
    parser.add_argument("--sweep", help="sweep (= MLflow experiment) to read; default: the spec's")
    parser.add_argument("--out", help="output folder; default: <state>/figures/<sweep>/<name>")
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI; default: $MLFLOW_TRACKING_URI, else the project's sqlite store",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="re-read every metric history from MLflow"
    )
    parser.add_argument(
        "--no-diagnostics", action="store_true", help="skip the companion diagnostics figure"
    )
    parser.add_argument("--list", action="store_true", help="list the figure specs and exit")
    parser.add_argument("--quiet", action="store_true", help="print only the files written")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from pdmask.errors import ConfigError
    from pdmask.figures.spec import available_specs, load_spec

    if args.list:
        for name in available_specs():
            spec = load_spec(name)
            print(f"{name:<16} sweep {spec.sweep:<16} {spec.title}")
        return 0
    if not args.name:
        raise ConfigError("give a figure name (pdm figure --list shows them)")

    from pdmask.figures import build_figure

    # styles=None: build_figure takes them from the recipe registry, else a fixed palette.
    result = build_figure(
        args.name,
        sweep=args.sweep,
        tracking_uri=args.tracking_uri,
        out_dir=args.out,
        use_cache=not args.no_cache,
        diagnostics=not args.no_diagnostics,
    )
    if not args.quiet:
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
    return 0
