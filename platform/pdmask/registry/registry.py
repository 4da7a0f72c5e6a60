"""Load the project's registry (recipes, sweeps, dashboards) and expand sweeps into trials."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdmask.errors import Problem, ValidationFailed, known_names
from pdmask.paths import project_root
from pdmask.registry.backends import BACKENDS, BackendSpec
from pdmask.registry.catalog import CLUSTERS, MODELS, PRECISIONS
from pdmask.registry.recipe_files import discover_recipes
from pdmask.registry.recipes import Recipe
from pdmask.registry.sim_knobs import AXIS_PREFIX as SIM_AXIS_PREFIX
from pdmask.registry.sim_knobs import KNOBS, resolve_knobs
from pdmask.registry.sweeps import (
    DEFAULT_MAX_TRIALS,
    SIM_PROFILES,
    Cell,
    Sweep,
    discover_sweeps,
    grid_size,
    iter_cells,
)
from pdmask.registry.trial import Trial
from pdmask.registry.yaml_source import YamlSource


@dataclass
class LeftOut:
    """Trials a backend leaves out of a sweep for one reason, and the methods of their cells."""

    trials: int
    methods: list[str]


def left_out_reason(cell: Cell, backend: BackendSpec) -> str | None:
    """Why ``backend`` leaves a grid cell out of its expansion; None when it runs the cell."""
    only_on = cell.get("backend")
    if only_on is not None and only_on[0] != backend.name:
        return f"cells for the {only_on[0]} backend only"
    knobs = sorted(k for k in cell if k.startswith(SIM_AXIS_PREFIX))
    if knobs and not backend.takes_sim_knobs:
        return f"cells setting {', '.join(knobs)} (embedded-backend knobs)"
    return None


@dataclass
class Registry:
    root: Path
    recipes: dict[str, Recipe]
    recipe_files: dict[str, Path]
    sweeps: dict[str, Sweep]  # the sweep files without problems
    sweep_sources: dict[str, YamlSource]
    dashboards: dict[str, Path]
    recipe_problems: list[Problem] = field(default_factory=list)
    # Methods whose recipe files do not load (name -> file): a sweep naming one is told so, not
    # that the method is unknown (the file's own problems say what is wrong with it).
    broken_recipes: dict[str, Path] = field(default_factory=dict)
    sweep_problems: list[Problem] = field(default_factory=list)
    # Sweep files with problems, by name: what could be salvaged (None if nothing) and the
    # source, so their grid's problems are reported together with the file's own.
    broken_sweeps: dict[str, tuple[Sweep | None, YamlSource | None]] = field(default_factory=dict)
    # What is wrong in the command line's overrides (``cli_overrides.with_overrides``): reported
    # by the expansion together with the sweep's own problems.
    command_line_problems: list[Problem] = field(default_factory=list)

    @property
    def problems(self) -> list[Problem]:
        return [*self.recipe_problems, *self.sweep_problems]

    def _file_problems(self, name: str) -> list[Problem]:
        return [p for p in self.sweep_problems if Path(p.file).stem == name]

    def sweep(self, name: str) -> Sweep:
        """The sweep named ``name`` (``sweeps/<name>.yaml``).

        Raises:
            ValidationFailed: no such sweep (the closest names given), or its file is broken
                (its problems, and the recipes').
        """
        if name not in self.sweeps:
            if name in self.broken_sweeps:
                raise ValidationFailed([*self.recipe_problems, *self._file_problems(name)])
            known = known_names(name, self.sweeps)
            raise ValidationFailed(
                [Problem(str(self.root / "sweeps"), "name", f"no sweep {name!r}; {known}")]
            )
        return self.sweeps[name]

    def trial_count(self, name: str) -> int:
        """How many trials the sweep plans, counted without expanding its grid."""
        sweep = self.sweeps.get(name) or self.broken_sweeps.get(name, (None, None))[0]
        if sweep is None:
            return 0
        if sweep.search is not None:
            return sweep.search.budget
        return grid_size(sweep.grid) * len(sweep.seed_list())

    def left_out(self, name: str, *, backend: str | None = None) -> dict[str, LeftOut]:
        """The trials of grid sweep ``name`` that ``backend`` (default: the sweep's) leaves out
        of its expansion, by reason (``left_out_reason``): a plan says what it does not run."""
        sweep = self.sweep(name)
        spec = BACKENDS.get(backend or sweep.backend)
        if sweep.search is not None or spec is None:
            return {}
        seeds = len(sweep.seed_list())
        matched = [False] * len(sweep.overrides)
        out: dict[str, LeftOut] = {}
        for cell in iter_cells(sweep.grid, ("grid",), [], self.sweep_sources[name]):
            cell = self.apply_overrides(sweep, cell, matched)
            reason = left_out_reason(cell, spec)
            if reason is None or not sweep.selects(cell):
                continue
            entry = out.setdefault(reason, LeftOut(0, []))
            entry.trials += seeds
            method = cell.get("method", (None,))[0]
            if method is not None and method not in entry.methods:
                entry.methods.append(method)
        return out

    def expand(
        self,
        name: str,
        *,
        backend: str | None = None,
        profile: str | None = None,
        cluster: str | None = None,
        max_trials: int | None = None,
    ) -> list[Trial]:
        """Every trial of a grid sweep (for a search sweep: one trial at the space's midpoint,
        which validates the base). A grid of more than ``max_trials`` (else the sweep's
        ``max_trials``, else DEFAULT_MAX_TRIALS) trials is refused before it is expanded.

        Raises:
            ValidationFailed: every problem at once: the file's own (schema, duplicate keys),
                its recipes', and those its grid shows.
        """
        if name in self.broken_sweeps:
            sweep, src = self.broken_sweeps[name]
            if sweep is None or src is None:
                raise ValidationFailed(
                    [*self.recipe_problems, *self._file_problems(name), *self.command_line_problems]
                )
        else:
            sweep, src = self.sweep(name), self.sweep_sources[name]
        problems = [*self.recipe_problems, *self._file_problems(name), *self.command_line_problems]
        backend = backend or sweep.backend
        profile_flag = profile is not None
        profile = profile or sweep.profile
        if backend not in BACKENDS:
            problems.append(
                Problem(
                    "--backend",
                    "backend",
                    f"unknown backend {backend!r}; known: {sorted(BACKENDS)}",
                )
            )
        else:
            problems += _settings_problems(sweep, src, BACKENDS[backend], profile, profile_flag)
        if (cluster or sweep.cluster) not in CLUSTERS:
            problems.append(
                src.problem(
                    ("cluster",),
                    f"unknown cluster {cluster or sweep.cluster!r}; known: {sorted(CLUSTERS)}",
                )
            )
        for i, fig in enumerate(sweep.figures):
            if fig not in self.dashboards:
                problems.append(
                    src.problem(
                        ("figures", i), f"no dashboard {fig!r}; {known_names(fig, self.dashboards)}"
                    )
                )
        if backend not in BACKENDS:  # the grid's cells cannot be checked against no backend
            raise ValidationFailed(_unique(problems))
        cap = max_trials or sweep.max_trials or DEFAULT_MAX_TRIALS
        count = self.trial_count(name)
        if count > cap:
            problems.append(
                src.problem(
                    ("grid",) if sweep.search is None else ("search", "budget"),
                    f"{count:,} trials exceed the cap of {cap:,}: set `max_trials: {count}` in "
                    f"the sweep or pass --max-trials {count} to confirm",
                )
            )
            raise ValidationFailed(_unique(problems))
        if sweep.search is not None:
            base: Cell = {k: (v, ("search", "base", k)) for k, v in sweep.search.base.items()}
            for axis, dim in sweep.search.space.items():
                mid = dim.choices[0] if dim.choices else (dim.low + dim.high) / 2
                base[axis] = (mid, ("search", "space", axis))
            cells = iter([base])
        else:
            cells = iter_cells(sweep.grid, ("grid",), problems, src)
        matched = [False] * len(sweep.overrides)
        seeds = sweep.seed_list()
        trials: dict[str, Trial] = {}
        for cell in cells:
            cell = self.apply_overrides(sweep, cell, matched)
            if not sweep.selects(cell):  # a command-line filter leaves it out
                continue
            for seed in seeds:
                trial = self._resolve(sweep, cell, seed, BACKENDS[backend], profile, src, problems)
                if trial is not None:
                    trials.setdefault(trial.trial_hash, trial)
        for i, hit in enumerate(matched):
            if not hit:
                problems.append(
                    src.problem(
                        ("overrides", sweep.override_position(i), "where"),
                        f"matches no cell of the grid ({sweep.overrides[i].where}): a typo, or "
                        "a value the grid does not have",
                    )
                )
        if problems:
            raise ValidationFailed(_unique(problems))
        return list(trials.values())

    @staticmethod
    def apply_overrides(sweep: Sweep, cell: Cell, matched: list[bool]) -> Cell:
        """The cell with every matching override applied; ``matched[i]`` turns True when
        override ``i`` matches (one that never does is reported)."""
        out = dict(cell)
        for i, ov in enumerate(sweep.overrides):
            if all(k in out and out[k][0] == v for k, v in ov.where.items()):
                matched[i] = True
                for k, v in ov.set.items():
                    out[k] = (v, ("overrides", sweep.override_position(i), "set", k))
        return out

    def _resolve(
        self,
        sweep: Sweep,
        cell: Cell,
        seed: int,
        backend: BackendSpec,
        profile: str,
        src: YamlSource,
        problems: list[Problem],
    ) -> Trial | None:
        before = len(problems)

        def need(axis: str, catalog: dict[str, Any] | None = None) -> Any:
            if axis not in cell:
                problems.append(src.problem(("grid",), f"a cell has no {axis!r} axis"))
                return None
            value, path = cell[axis]
            if catalog is not None and value not in catalog:
                problems.append(
                    src.problem(path, f"unknown {axis} {value!r}; {known_names(value, catalog)}")
                )
                return None
            return value

        named = cell.get("method", (None,))[0]
        broken = self.broken_recipes.get(named) if isinstance(named, str) else None
        if broken is not None:
            problems.append(
                src.problem(
                    cell["method"][1],
                    f"method {cell['method'][0]!r} is declared in {broken}, which does not load "
                    "(its own problems are listed with it)",
                )
            )
        method, model, precision = (
            None if broken is not None else need("method", self.recipes),
            need("model", MODELS),
            need("precision", PRECISIONS),
        )
        mu_source = cell.get("mu_source", ("rollout", ()))
        if mu_source[0] not in ("rollout", "recompute"):
            problems.append(
                src.problem(
                    mu_source[1],
                    f"mu_source must be 'rollout' or 'recompute', got {mu_source[0]!r}",
                )
            )
        elif mu_source[0] not in backend.mu_sources:
            problems.append(
                src.problem(
                    mu_source[1],
                    f"backend {backend.name!r} cannot supply mu_source {mu_source[0]!r} (it has "
                    f"{list(backend.mu_sources)})",
                )
            )
        only_on = cell.get("backend")
        if only_on is not None and only_on[0] not in BACKENDS:
            problems.append(
                src.problem(
                    only_on[1],
                    f"unknown backend {only_on[0]!r}; {known_names(only_on[0], BACKENDS)}",
                )
            )
            return None
        if left_out_reason(cell, backend) is not None:
            return None  # reported by the plan (Registry.left_out)
        sim_axes = {
            k.removeprefix(SIM_AXIS_PREFIX): (v, p)
            for k, (v, p) in cell.items()
            if k.startswith(SIM_AXIS_PREFIX)
        }
        sim, knob_errors = resolve_knobs({k: v for k, (v, _) in sim_axes.items()})
        for knob, err in knob_errors:
            path = sim_axes.get(knob, (None, ("grid",)))[1]
            problems.append(src.problem(_axis_of(path) if knob not in KNOBS else path, err))
        if method is None:
            return None
        recipe = self.recipes[method]
        overrides = {
            k.removeprefix("params."): v for k, (v, _) in cell.items() if k.startswith("params.")
        }
        delta = cell.get("delta", (None, ("grid",)))
        if delta[0] is not None and (
            not isinstance(delta[0], int | float)
            or isinstance(delta[0], bool)
            or not math.isfinite(delta[0])
            or delta[0] <= 0
        ):
            problems.append(
                src.problem(delta[1], f"delta must be a positive number, got {delta[0]!r}")
            )
        elif recipe.uses_delta and delta[0] is not None:
            # The axis sets the recipe's delta-role parameters, each one the cell does not set by
            # name; a recipe without one ignores the axis (its cells collapse into one trial).
            for name in recipe.role_params("delta"):
                overrides.setdefault(name, float(delta[0]))
        params, errors = recipe.resolve_params(overrides)
        for key, err in errors:
            path = cell.get(f"params.{key}", cell.get(key, (None, ("grid",))))[1]
            if key not in recipe.params:  # the axis is wrong, whatever its values: said once
                path, err = _axis_of(path), f"unknown parameter; {known_names(key, recipe.params)}"
            problems.append(src.problem(path, f"recipe {method!r}: params.{key}: {err}"))
        missing = sorted(set(recipe.needs) - backend.supplies)
        if missing:
            reasons = "; ".join(
                f"{name}: {backend.withholds[name]}"
                for name in missing
                if name in backend.withholds
            )
            problems.append(
                src.problem(
                    cell["method"][1],
                    f"backend {backend.name!r} cannot supply {missing} needed by {method!r}"
                    + (f" ({reasons})" if reasons else ""),
                )
            )
        if len(problems) > before or model is None or precision is None:
            return None
        trial_delta = recipe.role_value("delta", params)
        return Trial(
            sweep=sweep.name,
            method=method,
            recipe_version=recipe.version,
            recipe_source=recipe.source,
            params=params,
            model=model,
            precision=precision,
            delta=None if trial_delta is None else float(trial_delta),
            seed=seed,
            backend=backend.name,
            profile=profile if "profile" in backend.settings else None,
            steps=sweep.steps,
            mu_source=mu_source[0],
            sim=sim,
        )


def _settings_problems(
    sweep: Sweep, src: YamlSource, backend: BackendSpec, profile: str, profile_flag: bool
) -> list[Problem]:
    """The trial settings (``TRIAL_SETTINGS``) the sweep sets that ``backend`` does not train
    with, each refused naming its field (``profile_flag``: the profile came from ``--profile``),
    and an unknown profile of a backend that has profiles."""

    def problem(field: str, message: str) -> Problem:
        if field == "profile" and profile_flag:
            return Problem("--profile", "profile", message)
        return src.problem((field,), message)

    problems = []
    reads = ", ".join(sorted(backend.settings)) or "none of them"
    if "profile" in backend.settings:
        if profile not in SIM_PROFILES:
            problems.append(
                problem("profile", f"unknown profile {profile!r}; known: {list(SIM_PROFILES)}")
            )
    # A file's profile is its own backend's setting: refused where that backend has none, left
    # out where `--backend` moved the sweep to one that has none (the file still runs there).
    elif profile_flag or ("profile" in sweep.model_fields_set and sweep.backend == backend.name):
        steps = "the sweep's `steps`" if "steps" in backend.settings else "its own budget"
        problems.append(
            problem(
                "profile",
                f"backend {backend.name!r} has no budget profiles (of the trial settings it "
                f"reads {reads}): its trials train {steps}; remove `profile`",
            )
        )
    if sweep.steps is not None and "steps" not in backend.settings:
        problems.append(
            problem(
                "steps",
                f"backend {backend.name!r} does not train a set number of steps (of the trial "
                f"settings it reads {reads}); remove `steps`",
            )
        )
    return problems


def _axis_of(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """The path of the axis a value's path points into (``grid.params.x.1`` -> ``grid.params.x``):
    a problem with the axis itself (a misspelt name) is one problem, not one per value."""
    return path[:-1] if path and isinstance(path[-1], int) else path


def _unique(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def load_registry(root: Path | None = None) -> Registry:
    """Discover recipes, sweeps and dashboards under ``root`` (default: the project root).
    Problems are collected, not raised: ``Registry.expand`` and ``pdm validate`` report them."""
    root = Path(root) if root is not None else project_root()
    folder = discover_recipes(root / "recipes")
    found, sweep_problems = discover_sweeps(root / "sweeps")
    troubled = {Path(p.file).stem for p in sweep_problems}
    broken = {k: v for k, v in found.items() if k in troubled or v[0] is None}
    found = {k: v for k, v in found.items() if k not in broken}
    dash_dir = root / "dashboards"
    dashboards = {p.stem: p for p in sorted(dash_dir.glob("*.yaml"))} if dash_dir.is_dir() else {}
    return Registry(
        root=root,
        recipes=folder.recipes,
        recipe_files=folder.files,
        sweeps={k: s for k, (s, _) in found.items()},
        sweep_sources={k: src for k, (_, src) in found.items()},
        dashboards=dashboards,
        recipe_problems=folder.problems,
        broken_recipes=folder.broken,
        sweep_problems=sweep_problems,
        broken_sweeps=broken,
    )
