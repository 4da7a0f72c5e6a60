"""The end of a sweep as printed, from its outcome alone: what the command and a library call show.

Counts and wall time; each setting's final headline metric, mean ± sd over its seeds; one line
per failed trial with its reason and where its log is; one per setting a deterministic failure
stopped; a search's best trial; where the runs and the logs are.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from pdmask.console import table
from pdmask.orchestration.canary import stop_line
from pdmask.orchestration.progress_view import duration, headline_label
from pdmask.orchestration.session import SweepOutcome
from pdmask.orchestration.summary import SettingResult, format_mean_sd
from pdmask.orchestration.trial_logs import logs_folder
from pdmask.registry import Sweep
from pdmask.tracking.store import redact


def _results_table(results: list[SettingResult], label: str):
    """Each setting's final headline metric: one row per setting where the settings differ by
    their method alone; else a methods x settings table of ``mean ± sd (n)``. Every column may
    wrap, so that a narrow terminal (80 columns) wraps the text and never drops a column."""
    cells = list(dict.fromkeys(r["cell"] for r in results))
    if cells == [""]:
        body = [[r["method"], r["n"], format_mean_sd(r["mean"], r["sd"])] for r in results]
        title = f"final {label} per setting, mean ± sd over seeds"
        return table(title, ["setting", "n", "mean ± sd"], body, wrap={"setting", "mean ± sd"})
    by_method: dict[str, dict[str, str]] = {}
    for r in results:
        text = f"{format_mean_sd(r['mean'], r['sd'])} ({r['n']})"
        by_method.setdefault(r["method"], {})[r["cell"]] = text
    body = [[method, *(row.get(c, "-") for c in cells)] for method, row in by_method.items()]
    title = f"final {label}, mean ± sd (n seeds), methods x settings"
    return table(title, ["method", *cells], body, wrap={"method", *cells})


def print_summary(console: Console, sweep: Sweep, out: SweepOutcome, uri: str) -> None:
    """Counts and wall time; each setting's final headline metric, mean ± sd over its seeds;
    one line per failed trial with its reason; the best trial of a search."""
    rows = [
        ["finished now", out.finished],
        ["reused from other sweeps (linked, not trained)", out.reused],
        ["finished by another copy of this sweep", out.finished_elsewhere],
        ["already finished (skipped)", out.skipped],
        ["failed", out.failed],
        ["configuration refused (fix it; never retried)", out.config_errors],
        ["recipe error (fix the recipe file; never retried)", out.recipe_errors],
        ["interrupted (resume: run again)", out.interrupted],
        ["running in another invocation", out.elsewhere],
        ["running on as Ray jobs (detached: the same command attaches)", out.detached],
        ["not started (their setting was stopped)", out.not_started],
    ]
    wall = "" if out.wall_s is None else f", wall time {duration(out.wall_s)}"
    console.print(table(f"sweep {sweep.name}: summary{wall}", ["", "trials"], rows))
    if out.results:
        label = headline_label(out.headline)
        console.print(_results_table(out.results, label))
        console.print(f"{label}: the mean of {', '.join(out.headline)} at the last step")
    for f in out.failures:
        console.print(
            f"[red]failed[/red] {escape(f['name'])}: {escape(f['reason'])} "
            f"(its log: `pdm logs {escape(f['name'])}`)"
        )
    for stopped in out.stopped:
        console.print(f"[red]stopped[/red] {escape(stop_line(stopped))}")
    if out.best:
        console.print(
            f"best trial: {out.best['run_name']} ({sweep.search.metric} = {out.best['value']:.4f}, "
            f"delta = {out.best['delta']}, run {out.best['run_id']})"
        )
    console.print(f"runs: {redact(uri)} (experiment {sweep.name}); inspect with `pdm ui`")
    console.print(f"trial logs: {logs_folder(sweep.name)} (`pdm logs RUN` prints one)")
