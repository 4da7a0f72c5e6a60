"""Load the project's registry (recipes, sweeps, dashboards) and expand sweeps into trials."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdmask.errors import Problem, ValidationFailed
from pdmask.paths import project_root
from pdmask.registry.catalog import CLUSTERS, MODELS, PRECISIONS
from pdmask.registry.recipes import Recipe, discover_recipes
from pdmask.registry.sim_knobs import AXIS_PREFIX as SIM_AXIS_PREFIX
from pdmask.registry.sim_knobs import resolve_knobs
from pdmask.registry.sweeps import SIM_PROFILES, Cell, Sweep, discover_sweeps, expand_grid
from pdmask.registry.trial import Trial
from pdmask.registry.yaml_source import YamlSource

# What each backend can hand a recipe (Recipe.needs).
BACKEND_SUPPLIES = {"sim": {"behaviour_topk", "behaviour_full"}, "verl": {"behaviour_topk"}}


@dataclass
class Registry:
    root: Path
    recipes: dict[str, Recipe]
    recipe_files: dict[str, Path]
    sweeps: dict[str, Sweep]
    sweep_sources: dict[str, YamlSource]
    dashboards: dict[str, Path]
    recipe_problems: list[Problem] = field(default_factory=list)
    sweep_problems: list[Problem] = field(default_factory=list)

    @property
    def problems(self) -> list[Problem]:
        return [*self.recipe_problems, *self.sweep_problems]

    def sweep(self, name: str) -> Sweep:
        if name not in self.sweeps:
            broken = [p for p in self.sweep_problems if Path(p.file).stem == name]
            if broken:
                raise ValidationFailed([*self.recipe_problems, *broken])
            known = ", ".join(sorted(self.sweeps)) or "(none)"
            raise ValidationFailed(
                [Problem(str(self.root / "sweeps"), "name", f"no sweep {name!r}; known: {known}")]
            )
        return self.sweeps[name]

    def expand(
        self,
        name: str,
        *,
        backend: str | None = None,
        profile: str | None = None,
        cluster: str | None = None,
    ) -> list[Trial]:
        """Every trial of a grid sweep (for a search sweep: one trial at the space's midpoint,
        which validates the base). Raises ValidationFailed listing every problem at once."""
        sweep = self.sweep(name)
        src = self.sweep_sources[name]
        problems = list(self.recipe_problems)
        backend = backend or sweep.backend
        profile = profile or sweep.profile
        if backend not in BACKEND_SUPPLIES:
            problems.append(
                Problem(
                    "--backend",
                    "backend",
                    f"unknown backend {backend!r}; known: {sorted(BACKEND_SUPPLIES)}",
                )
            )
        if profile not in SIM_PROFILES:
            problems.append(
                src.problem(
                    ("profile",), f"unknown profile {profile!r}; known: {list(SIM_PROFILES)}"
                )
            )
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
                        ("figures", i), f"no dashboard {fig!r}; known: {sorted(self.dashboards)}"
                    )
                )
        if sweep.search is not None:
            base: Cell = {k: (v, ("search", "base", k)) for k, v in sweep.search.base.items()}
            for axis, dim in sweep.search.space.items():
                mid = dim.choices[0] if dim.choices else (dim.low + dim.high) / 2
                base[axis] = (mid, ("search", "space", axis))
            cells = [base]
        else:
            cells = expand_grid(sweep.grid, ("grid",), problems, src)
        trials: dict[str, Trial] = {}
        for cell in cells:
            cell = self._apply_overrides(sweep, cell, src, problems)
            for seed in sweep.seed_list():
                trial = self._resolve(sweep, cell, seed, backend, profile, src, problems)
                if trial is not None:
                    trials.setdefault(trial.trial_hash, trial)
        if problems:
            raise ValidationFailed(_unique(problems))
        return list(trials.values())

    def _apply_overrides(
        self, sweep: Sweep, cell: Cell, src: YamlSource, problems: list[Problem]
    ) -> Cell:
        out = dict(cell)
        for i, ov in enumerate(sweep.overrides):
            if all(k in out and out[k][0] == v for k, v in ov.where.items()):
                for k, v in ov.set.items():
                    out[k] = (v, ("overrides", i, "set", k))
        return out

    def _resolve(
        self,
        sweep: Sweep,
        cell: Cell,
        seed: int,
        backend: str,
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
                    src.problem(path, f"unknown {axis} {value!r}; known: {sorted(catalog)}")
                )
                return None
            return value

        method, model, precision = (
            need("method", self.recipes),
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
        sim_axes = {
            k.removeprefix(SIM_AXIS_PREFIX): (v, p)
            for k, (v, p) in cell.items()
            if k.startswith(SIM_AXIS_PREFIX)
        }
        if sim_axes and backend != "sim":
            return None  # a cell of embedded-backend knobs: other backends leave it out
        sim, knob_errors = resolve_knobs({k: v for k, (v, _) in sim_axes.items()})
        for knob, err in knob_errors:
            problems.append(src.problem(sim_axes.get(knob, (None, ("grid",)))[1], err))
        if method is None:
            return None
        recipe = self.recipes[method]
        overrides = {
            k.removeprefix("params."): v for k, (v, _) in cell.items() if k.startswith("params.")
        }
        delta = cell.get("delta", (None, ("grid",)))
        if delta[0] is not None and (
            not isinstance(delta[0], int | float) or isinstance(delta[0], bool) or delta[0] <= 0
        ):
            problems.append(
                src.problem(delta[1], f"delta must be a positive number, got {delta[0]!r}")
            )
        elif recipe.uses_delta and delta[0] is not None:
            overrides["delta"] = float(delta[0])
        params, errors = recipe.resolve_params(overrides)
        for key, err in errors:
            path = cell.get(f"params.{key}", cell.get(key, (None, ("grid",))))[1]
            problems.append(src.problem(path, f"recipe {method!r}: params.{key}: {err}"))
        missing = set(recipe.needs) - BACKEND_SUPPLIES.get(backend, set())
        if missing:
            problems.append(
                src.problem(
                    cell["method"][1],
                    f"backend {backend!r} cannot supply {sorted(missing)} needed by {method!r}",
                )
            )
        if len(problems) > before or model is None or precision is None:
            return None
        trial_delta = params.get("delta", delta[0])
        return Trial(
            sweep=sweep.name,
            method=method,
            recipe_version=recipe.version,
            params=params,
            model=model,
            precision=precision,
            delta=None if trial_delta is None else float(trial_delta),
            seed=seed,
            backend=backend,
            profile=profile,
            steps=sweep.steps,
            mu_source=mu_source[0],
            sim=sim,
        )


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
    recipes, recipe_files, recipe_problems = discover_recipes(root / "recipes")
    found, sweep_problems = discover_sweeps(root / "sweeps")
    dash_dir = root / "dashboards"
    dashboards = {p.stem: p for p in sorted(dash_dir.glob("*.yaml"))} if dash_dir.is_dir() else {}
    return Registry(
        root=root,
        recipes=recipes,
        recipe_files=recipe_files,
        sweeps={k: s for k, (s, _) in found.items()},
        sweep_sources={k: src for k, (_, src) in found.items()},
        dashboards=dashboards,
        recipe_problems=recipe_problems,
        sweep_problems=sweep_problems,
    )
