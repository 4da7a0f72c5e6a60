"""Which MLflow runs feed a figure: listing a sweep's runs and sorting them into cells.

Reads only through ``MlflowClient.search_runs``. A *cell* is one (panel, series) pair, the series
being a method or a control (``FigureSpec.controls``); its runs are the seeds. Runs are matched by
tags (design contract), never by run name: ``pdm.model`` + ``pdm.precision`` select the panel,
``pdm.method`` the line, ``pdm.seed`` pairs methods in the summary. A run with embedded-backend
knobs (``pdm.sim.*`` tags, e.g. an lr = 0 control or another task regime) joins a line only when
the figure's or a control's tags ask for exactly those knobs: runs of different experiments never
mix in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pdmask.errors import ConfigError, TrackingError
from pdmask.figures.spec import FigureSpec

TERMINAL = frozenset({"FINISHED", "FAILED", "KILLED"})
STOPPED = frozenset({"FAILED", "KILLED"})
# When two runs claim the same (panel, method, seed), the one with the best status is drawn.
_STATUS_RANK = {"FINISHED": 0, "RUNNING": 1, "SCHEDULED": 2, "FAILED": 3, "KILLED": 4}


@dataclass(frozen=True)
class RunRecord:
    """What the figure needs to know about one MLflow run (one trial)."""

    run_id: str
    status: str
    start_time: int | None
    end_time: int | None
    tags: Mapping[str, str]
    metric_keys: frozenset[str]

    def tag(self, name: str) -> str:
        return self.tags.get(f"pdm.{name}", "")

    @property
    def method(self) -> str:
        return self.tag("method")

    @property
    def seed(self) -> str:
        return self.tag("seed")

    @property
    def stopped(self) -> bool:
        """Failed, killed, or tagged as collapsed by the trainer: drawn up to its end and marked."""
        return self.status in STOPPED or self.tag("collapsed").lower() in {"1", "true", "yes"}

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


def open_client(tracking_uri: str):
    """A checked MlflowClient; a missing sqlite file is an error here (a figure creates no store)."""
    if tracking_uri.startswith("sqlite:"):
        db = tracking_uri.removeprefix("sqlite:///")
        if db and db != ":memory:" and not Path(db).exists():
            raise TrackingError(f"no MLflow store at {tracking_uri} (nothing has been run yet?)")
    from pdmask.tracking.store import open_client as open_checked_client

    return open_checked_client(tracking_uri)


def list_runs(client, sweep: str) -> list[RunRecord]:
    """Every active run of the sweep's experiment (all pages)."""
    from mlflow.exceptions import MlflowException

    try:
        experiment = client.get_experiment_by_name(sweep)
    except MlflowException as err:
        raise TrackingError(f"cannot read the MLflow store: {err}") from err
    if experiment is None:
        raise ConfigError(
            f"no MLflow experiment named {sweep!r} in this store; run `pdm sweep {sweep}` first "
            "or pass --sweep / --tracking-uri"
        )
    records: list[RunRecord] = []
    token = None
    try:
        while True:
            page = client.search_runs(
                [experiment.experiment_id], max_results=1000, page_token=token
            )
            records.extend(
                RunRecord(
                    run_id=r.info.run_id,
                    status=r.info.status,
                    start_time=r.info.start_time,
                    end_time=r.info.end_time,
                    tags=dict(r.data.tags),
                    metric_keys=frozenset(r.data.metrics),
                )
                for r in page
            )
            token = page.token
            if not token:
                break
    except MlflowException as err:
        raise TrackingError(f"cannot list the runs of {sweep!r}: {err}") from err
    return records


def _delta_matches(tag: str, wanted: float) -> bool:
    try:
        value = float(tag)
    except ValueError:
        return True  # no numeric delta: a method without a delta (e.g. the ratio clip)
    return not math.isfinite(value) or math.isclose(value, wanted, rel_tol=1e-6, abs_tol=1e-9)


@dataclass
class Selection:
    """Runs sorted into cells, plus what was left out and why (for the manifest)."""

    cells: dict[tuple[str, str], list[RunRecord]] = field(default_factory=dict)
    superseded: list[tuple[RunRecord, str]] = field(default_factory=list)  # (run, kept run id)
    ignored: dict[str, int] = field(default_factory=dict)  # reason -> count

    def runs(self) -> list[RunRecord]:
        return [r for runs in self.cells.values() for r in runs]


def select_runs(
    spec: FigureSpec, runs: list[RunRecord], trial_hashes: set[str] | None = None
) -> Selection:
    """Sort a sweep's runs into (panel key, method) cells, one run per seed.

    ``trial_hashes``: the trials of the sweep as it was resolved (its profile, steps, backend):
    runs of other trials are left out. Without it, runs of different trials that land on one
    (panel, method, seed) are an error rather than one silently replacing the other: two
    profiles of one sweep share the experiment, and only a retry of the same trial supersedes.
    """
    selection = Selection()
    panels = {(p.model, p.precision): p for p in spec.panels}
    methods = set(spec.all_methods)
    figure_knobs = _knob_tags(spec.tags)

    def skip(reason: str) -> None:
        selection.ignored[reason] = selection.ignored.get(reason, 0) + 1

    by_seed: dict[tuple[str, str, str], list[RunRecord]] = {}
    for run in runs:
        if trial_hashes is not None and run.tag("trial_hash") not in trial_hashes:
            skip("other trial config (profile, steps, ...)")
        elif spec.delta is not None and not _delta_matches(run.tag("delta"), spec.delta):
            skip("other delta")
        elif spec.backend is not None and run.tag("backend") != spec.backend:
            skip("other backend")
        elif any(run.tags.get(k) != v for k, v in spec.tags.items()):
            skip("tag filter")
        elif (series := _series(spec, run, figure_knobs)) is None:
            skip("method not in figure" if run.method not in methods else OTHER_KNOBS)
        elif (run.tag("model"), run.tag("precision")) not in panels:
            skip("setting not in figure")
        else:
            panel = panels[(run.tag("model"), run.tag("precision"))]
            if any(run.tags.get(k) != v for k, v in panel.tags.items()):
                skip("panel tag filter")
                continue
            seed = run.seed or run.run_id  # untagged seeds never collapse into one
            by_seed.setdefault((panel.key, series, seed), []).append(run)

    clashes = []
    for (panel_key, method, seed), candidates in by_seed.items():
        trials = {r.tag("trial_hash") or r.run_id for r in candidates}
        if len(trials) > 1:
            profiles = sorted({r.tag("profile") or "?" for r in candidates})
            clashes.append(f"{panel_key}/{method}/seed {seed}: profiles {', '.join(profiles)}")
            continue
        # Best status first, then the most recent start: a retried trial replaces its failure.
        candidates.sort(key=lambda r: (_STATUS_RANK.get(r.status, 9), -(r.start_time or 0)))
        kept = candidates[0]
        selection.cells.setdefault((panel_key, method), []).append(kept)
        selection.superseded.extend((r, kept.run_id) for r in candidates[1:])
    if clashes:
        raise ConfigError(
            f"figure {spec.name}: runs of different trials would share a line and seed "
            f"({'; '.join(clashes[:3])}{'; ...' if len(clashes) > 3 else ''}): build it with "
            "the sweep (`pdm sweep NAME --profile P` selects its own trials) or filter the runs "
            "with the spec's `tags`, e.g. {pdm.profile: default}"
        )
    for runs_in_cell in selection.cells.values():
        runs_in_cell.sort(key=_seed_order)
    return selection


KNOB_TAG_PREFIX = "pdm.sim."


def _knob_tags(tags: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in tags.items() if k.startswith(KNOB_TAG_PREFIX)}


OTHER_KNOBS = "embedded-backend knobs not in figure"


def _series(spec: FigureSpec, run: RunRecord, figure_knobs: dict[str, str]) -> str | None:
    """The line ``run`` belongs to: a control's key, its method, or None (not in the figure)."""
    knobs = _knob_tags(run.tags)
    for control in spec.controls:
        wanted = {**figure_knobs, **_knob_tags(control.tags)}
        tags_match = all(run.tags.get(k) == v for k, v in control.tags.items())
        if run.method == control.method and knobs == wanted and tags_match:
            return control.key
    if run.method in spec.all_methods and knobs == figure_knobs:
        return run.method
    return None


def _seed_order(run: RunRecord) -> tuple:
    seed = run.seed
    return (0, int(seed), "") if seed.lstrip("-").isdigit() else (1, 0, seed)
