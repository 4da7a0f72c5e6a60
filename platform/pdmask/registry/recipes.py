"""Recipes: one file per method in the project's ``recipes/`` folder.

A recipe file is a Python module that defines ``RECIPE = Recipe(...)``. It names the method, says
how figures draw it, documents its parameters, and either composes a proximity test and a
direction test from ``pdmask.trust_region`` by name, or brings its own per-token ``mask`` function
when the method needs new math. Dropping a new file into ``recipes/`` is all it takes to add a
baseline: it is discovered, validated, listed by ``pdm recipes list``, usable in any sweep and
trained by every backend that can supply its inputs.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pdmask.errors import Problem
from pdmask.registry.math_names import DIRECTION_NAMES, PROXIMITY_NAMES

if TYPE_CHECKING:  # the math API (and torch) load only when a mask is computed
    import torch

    from pdmask.trust_region import TokenStats

# What a backend may have to supply for a recipe to train (see ``Recipe.needs``).
KNOWN_INPUTS = {
    "behaviour_topk": "the behaviour policy's top-K ids and log-probs per response token",
    "behaviour_full": "the behaviour policy's full distribution (only the embedded backend has it)",
}

MaskFn = Callable[..., Any]
"""A recipe's own mask: ``fn(stats: TokenStats, advantages: Tensor, params: dict) -> bool Tensor``."""


class Param(BaseModel):
    """One tunable parameter of a recipe."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: float | int | str | bool | None = Field(
        description="Value used when a sweep sets none."
    )
    description: str = Field(description="What the parameter does, shown by `pdm recipes list -v`.")
    ge: float | None = Field(None, description="Smallest allowed value (inclusive), for numbers.")
    le: float | None = Field(None, description="Largest allowed value (inclusive), for numbers.")
    choices: tuple[str, ...] | None = Field(None, description="Allowed values, for strings.")

    def check(self, value: Any) -> str | None:
        """An error message if ``value`` is not allowed, else None."""
        if value is None:
            return None if self.default is None else "must be set"
        if self.choices is not None:
            return (
                None if value in self.choices else f"{value!r} is not one of {list(self.choices)}"
            )
        if isinstance(self.default, bool) != isinstance(value, bool):
            return f"expected {type(self.default).__name__}, got {value!r}"
        if isinstance(self.default, int | float) or self.ge is not None or self.le is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                return f"expected a number, got {value!r}"
            if self.ge is not None and value < self.ge:
                return f"{value} is below the minimum {self.ge}"
            if self.le is not None and value > self.le:
                return f"{value} is above the maximum {self.le}"
        return None


class Recipe(BaseModel):
    """A trust-region method, as declared by one file of ``recipes/``."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(
        description="Identity used in sweeps, MLflow tags and verl (`-` becomes `_`)."
    )
    display_name: str = Field(description="Short label for figure legends (cosmetic).")
    color: str = Field(description="Figure colour as #rrggbb, the same in every panel (cosmetic).")
    summary: str = Field(description="One line: what the method is.")
    launch: str = Field(
        "pdm sweep smoke  # or add this name to any sweep's `method` axis",
        description="How to launch it (shown by `pdm recipes list -v`).",
    )
    proximity: str | None = Field(
        None, description=f"Proximity test from the math API: one of {sorted(PROXIMITY_NAMES)}."
    )
    direction: str | None = Field(
        None, description=f"Direction test from the math API: one of {sorted(DIRECTION_NAMES)}."
    )
    mask: MaskFn | None = Field(
        None,
        description="Own per-token mask fn(stats, advantages, params) -> bool (True = zeroed), "
        "for methods that need new math; replaces proximity/direction.",
        exclude=True,
    )
    params: dict[str, Param] = Field(default_factory=dict, description="Tunable parameters.")
    needs: tuple[str, ...] = Field(
        (), description=f"Inputs a backend must supply: {sorted(KNOWN_INPUTS)}."
    )
    verl_loss_mode: str | None = Field(
        None,
        description="verl policy-loss name if not the pdmask-registered `name` with `-`→`_` "
        "(e.g. `vanilla` for GRPO clip-higher, which is configuration only).",
    )
    version: int = Field(
        1, description="Bump when the recipe's behaviour changes: it is part of trial identity."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", v):
            raise ValueError("must be lower-case words joined by '-', e.g. 'pdm-agg'")
        return v

    @field_validator("color")
    @classmethod
    def _color(cls, v: str) -> str:
        if not re.fullmatch(r"#[0-9a-fA-F]{6}", v):
            raise ValueError("must be a #rrggbb colour")
        return v

    @field_validator("needs")
    @classmethod
    def _needs(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [x for x in v if x not in KNOWN_INPUTS]
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; known: {sorted(KNOWN_INPUTS)}")
        return v

    @model_validator(mode="after")
    def _tests(self) -> Recipe:
        if self.mask is None:
            if self.proximity is None or self.direction is None:
                raise ValueError("give `proximity` and `direction`, or an own `mask` function")
            if self.proximity not in PROXIMITY_NAMES:
                raise ValueError(
                    f"proximity {self.proximity!r} unknown; known: {sorted(PROXIMITY_NAMES)}"
                )
            if self.direction not in DIRECTION_NAMES:
                raise ValueError(
                    f"direction {self.direction!r} unknown; known: {sorted(DIRECTION_NAMES)}"
                )
        for pname, p in self.params.items():
            err = p.check(p.default) if p.default is not None else None
            if err:
                raise ValueError(f"params.{pname}.default: {err}")
        return self

    @property
    def uses_delta(self) -> bool:
        return "delta" in self.params

    @property
    def verl_name(self) -> str:
        return self.verl_loss_mode or self.name.replace("-", "_")

    def resolve_params(
        self, overrides: dict[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Defaults overlaid with ``overrides``; returns (params, [(param name, error message)])."""
        errors = [
            (k, f"unknown parameter; known: {sorted(self.params)}")
            for k in overrides
            if k not in self.params
        ]
        resolved = {k: p.default for k, p in self.params.items()}
        resolved.update({k: v for k, v in overrides.items() if k in self.params})
        for k, v in resolved.items():
            err = self.params[k].check(v)
            if err:
                errors.append((k, err))
        return resolved, errors

    def mask_fn(self, params: dict[str, Any]) -> Callable[[TokenStats, torch.Tensor], torch.Tensor]:
        """The per-token mask with ``params`` bound: ``fn(stats, advantages) -> bool`` (True = zeroed)."""
        if self.mask is not None:
            own = self.mask
            return lambda stats, adv: own(stats, adv, params)
        from pdmask.trust_region import composed_mask

        proximity, direction = self.proximity, self.direction
        kwargs = {k: params[k] for k in ("delta", "eps_low", "eps_high") if k in params}
        return lambda stats, adv: composed_mask(proximity, direction, stats, adv, **kwargs)


def load_recipe_file(path: Path) -> tuple[Recipe | None, list[Problem]]:
    """Import one recipe file by path (no package needed) and return its ``RECIPE``."""
    module_name = f"pdmask_recipe_{path.stem.replace('-', '_')}"
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # pydantic and pickling need the module to be findable
        spec.loader.exec_module(module)
    except ValidationError as err:
        return None, _validation_problems(path, err)
    except Exception as err:  # a broken recipe must not hide the others' problems
        tb = traceback.extract_tb(err.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == str(path)), None)
        return None, [Problem(str(path), "(module)", f"{type(err).__name__}: {err}", line)]
    recipe = getattr(module, "RECIPE", None)
    if not isinstance(recipe, Recipe):
        return None, [Problem(str(path), "RECIPE", "the file must define RECIPE = Recipe(...)")]
    return recipe, []


def _validation_problems(path: Path, err: ValidationError) -> list[Problem]:
    out = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "RECIPE"
        out.append(Problem(str(path), field, e["msg"].removeprefix("Value error, ")))
    return out


def discover_recipes(folder: Path) -> tuple[dict[str, Recipe], dict[str, Path], list[Problem]]:
    """Every ``*.py`` in ``folder`` (not starting with ``_``), validated; all problems at once."""
    recipes: dict[str, Recipe] = {}
    sources: dict[str, Path] = {}
    problems: list[Problem] = []
    if not folder.is_dir():
        return recipes, sources, [Problem(str(folder), "(folder)", "recipes folder not found")]
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        recipe, errs = load_recipe_file(path)
        problems += errs
        if recipe is None:
            continue
        if recipe.name in recipes:
            problems.append(
                Problem(
                    str(path), "name", f"{recipe.name!r} is also declared in {sources[recipe.name]}"
                )
            )
            continue
        recipes[recipe.name] = recipe
        sources[recipe.name] = path
    return recipes, sources, problems
