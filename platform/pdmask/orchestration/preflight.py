"""What a sweep must pass before anything launches, and what `pdm validate` reports.

The registry's expansion checks the sweep file itself (schema, grid, overrides, size). Here the
sweep is checked against the parts that consume it, every problem at once: each recipe's mask and
loss run on synthetic batches of each backend's layout with the trial's parameters
(``registry.recipe_check``), and each dashboard it names must parse, draw recipes, have a metric
pattern that matches an evaluation metric the backend logs, and select some of the sweep's
trials. A recipe that crashes or a figure that could never be drawn is a bad input, found before
hours of training rather than after.
"""

from __future__ import annotations

from pdmask.errors import ConfigError, Problem, ValidationFailed
from pdmask.registry import Registry, Trial


def environment_problems(
    address: str | None = None, jobs: bool = False, env=None, insecure: bool = False
) -> list[Problem]:
    """What is wrong in the settings a sweep reads from its environment and flags (the watchdog's
    bounds, the Ray address: ``cluster/address.py``, and for jobs its authentication:
    ``cluster/auth.py``, refused without a token unless ``insecure``), each named by its
    variable."""
    from pdmask.orchestration.cluster.address import address_problems
    from pdmask.orchestration.cluster.auth import auth_problems
    from pdmask.watchdog import site_bounds

    problems = address_problems(address, jobs)
    if jobs and address and not problems:
        problems = auth_problems(address, insecure, env)
    try:
        site_bounds(env)
    except ConfigError as err:
        problems.append(Problem("environment", "watchdog bounds", str(err)))
    return problems


def eval_metrics(backend: str, cluster: str) -> list[str]:
    """The evaluation metrics ``backend`` logs on ``cluster``, as stored in MLflow (the design's
    contract: `val-core/<dataset>/acc/mean@16`, with `@` sanitised)."""
    from pdmask.backends.interface import load_backend

    return load_backend(backend).eval_metrics(cluster)


def backend_problems(reg: Registry, name: str, trials: list[Trial]) -> list[Problem]:
    """What the trials' backend refuses in them (its ``check``), naming each trial."""
    from pdmask.backends.interface import load_backend

    file = str(reg.sweep_sources[name].path) if name in reg.sweep_sources else name
    problems = []
    for trial in trials:
        for message in load_backend(trial.backend).check(trial):
            problems.append(Problem(file, "trial", f"{trial.run_name()}: {message}"))
    return problems


def dashboard_problems(
    reg: Registry, name: str, trials: list[Trial], cluster: str | None = None
) -> list[Problem]:
    """Why the dashboards of sweep ``name`` could not draw its ``trials`` (empty: they can)."""
    from pdmask.figures.spec import sweep_fit_problems

    sweep = reg.sweep(name)
    backend = trials[0].backend if trials else sweep.backend
    problems: list[Problem] = []
    for figure in sweep.figures:
        if figure not in reg.dashboards:
            continue  # reported by the expansion
        problems += sweep_fit_problems(
            figure,
            # a search's planned trial is only its space's midpoint: any delta may be drawn
            trials=trials if sweep.search is None else [],
            recipes=set(reg.recipes),
            eval_metrics=eval_metrics(backend, cluster or sweep.cluster),
            directory=reg.root / "dashboards",
        )
    return problems


def checked_trials(
    reg: Registry,
    name: str,
    *,
    backend: str | None = None,
    profile: str | None = None,
    cluster: str | None = None,
    max_trials: int | None = None,
    address: str | None = None,
    insecure: bool = False,
) -> list[Trial]:
    """The sweep's trials after every check, the Ray ``address`` they will run on included (and
    for jobs its authentication, ``insecure`` accepting none); raises ValidationFailed with all
    problems."""
    from pdmask.registry.backends import Launch, backend_spec
    from pdmask.registry.recipe_check import check_recipes

    trials = reg.expand(
        name, backend=backend, profile=profile, cluster=cluster, max_trials=max_trials
    )
    problems = check_recipes(reg.recipes, trials, defaults=False)
    problems += backend_problems(reg, name, trials)
    problems += dashboard_problems(reg, name, trials, cluster)
    jobs = bool(trials) and backend_spec(trials[0].backend).launch is Launch.RAY_JOBS
    problems += environment_problems(address, jobs, insecure=insecure)
    if problems:
        raise ValidationFailed(problems)
    return trials


def validate_sweeps(
    reg: Registry, names: list[str] | None = None, max_trials: int | None = None
) -> dict[str, int]:
    """Trial count per sweep (default: every sweep file, broken ones included) after every
    check, every recipe's defaults included.

    Raises:
        ValidationFailed: the problems of all of them together (`pdm validate`'s exit 2).
        BackendUnavailable: a sweep's backend lacks its optional dependencies.
    """
    from pdmask.registry.recipe_check import check_recipes

    problems = list(reg.problems)
    counts: dict[str, int] = {}
    trials: list[Trial] = []  # of every sweep: each distinct recipe and parameters checked once
    for name in names or sorted({*reg.sweeps, *reg.broken_sweeps}):
        try:
            expanded = reg.expand(name, max_trials=max_trials)
        except ValidationFailed as err:
            problems += [p for p in err.problems if p not in problems]
            continue
        problems += [p for p in backend_problems(reg, name, expanded) if p not in problems]
        problems += [p for p in dashboard_problems(reg, name, expanded) if p not in problems]
        counts[name] = len(expanded)
        trials += expanded
    problems += [p for p in check_recipes(reg.recipes, trials) if p not in problems]
    if problems:
        raise ValidationFailed(problems)
    return counts
