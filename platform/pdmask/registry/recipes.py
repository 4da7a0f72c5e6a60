"""Recipes: one file per method in the project's ``recipes/`` folder; the only list of methods.

A recipe file is a Python module that defines ``RECIPE = Recipe(...)``. It names the method, says
how figures draw it, documents its parameters, and defines what the method does per token:

- a **mask** (True = the token's gradient is zeroed): a proximity test and a direction test of
  the math API composed by name (``proximity="kl_topk", direction="ddot_agg"``), or its own
  function ``mask(batch) -> bool [B, T]``;
- a **loss**: by default ``-M r A`` with the gradient through ``r`` (and the optional
  truncated-IS cap of the ``ratio_cap`` parameter), or its own ``loss(batch) -> [B, T]``.

Both functions receive one :class:`pdmask.trust_region.RecipeBatch`: the token statistics,
advantages, response mask, sequence layout (rows = responses), lengths, the resolved parameters
and the backend and precision it runs under (its docstring states the shapes). A method may
give either function or both. Dropping a new file into ``recipes/`` is all it takes: it is
discovered, validated (also by running it on synthetic batches), listed, usable in any sweep
and trained by every backend that can supply its inputs.

**Parameter roles.** A few parameters mean something to the platform beyond the recipe's own
functions; a :class:`Param` says so with ``role``, and backends ask the recipe for the parameter
of a role instead of guessing from names. ``PARAM_ROLES`` documents them. One parameter per role,
but for ``delta``: a method with several thresholds (one per advantage sign, say) gives each of
them the role, and a sweep's ``delta`` axis sets them all.
"""

from __future__ import annotations

import math
import re
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from pdmask.errors import Problem, RecipeError
from pdmask.registry.math_names import DIRECTION_NAMES, PROXIMITY_NAMES

if TYPE_CHECKING:  # the math API (and torch) load only when a method runs
    from pdmask.registry.recipe_source import RecipeSource
    from pdmask.trust_region import Method, RecipeBatch

# What a backend may have to supply for a recipe to train (see ``Recipe.needs``).
KNOWN_INPUTS = {
    "behaviour_topk": "the behaviour policy's top-K ids and log-probs per response token",
    "behaviour_full": "the behaviour policy's full distribution",
    "entropy": "per-token entropy H(pi_t), differentiable (`batch.entropy`)",
    "support_log_probs": "log pi over S = TopK(mu) + {y} and the tail's mass, differentiable "
    "(`batch.support`)",
    "second_order": "the tail's sum of pi^3 and Var_pi(v), exact and in agg, uni and bucket "
    "forms (`batch.stats.var_v`, `var_v_agg`, `var_v_uni`, `var_v_bucket`, `tail_sum_cube`)",
    "output_kernel": "|h|^2 and the output-embedding kernel term gram_agg per token "
    "(`batch.stats.kernel`, from the lm head's input and weight)",
}

ParamRole = Literal["delta", "topk", "ratio_cap", "clip_low", "clip_high"]
PARAM_ROLES: dict[str, str] = {
    "delta": "the trust-region radius of the proximity test. A sweep's `delta` axis sets this "
    "parameter; a recipe without one is not crossed with that axis (one trial, no delta in its "
    "name or tags). The backends log the out-of-region diagnostics against it (VeRL: "
    "`policy_loss.pdm_delta`). The one role several parameters may play (a method with several "
    "thresholds): the axis sets every one that the cell does not set by name "
    "(`params.<name>`), and the first declared is the trial's delta.",
    "topk": "K, how many of the behaviour policy's top log-probs the rollout engine returns per "
    "token (embedded backend: the behaviour copy's top-K view; VeRL: `policy_loss.pdm_topk` and "
    "`rollout.custom.pdm_topk`).",
    "ratio_cap": "the truncated-IS cap C of the default loss: min(r, C), gradient scaled, not "
    "dropped (VeRL: `policy_loss.pdm_ratio_cap`). A recipe with its own loss reads its "
    "parameters itself.",
    "clip_low": "PPO's lower clip eps_low of the `ratio` proximity test (r < 1 - eps_low); for "
    "a recipe that runs as verl's own loss (`verl_loss_mode`) also verl's `clip_ratio_low`.",
    "clip_high": "PPO's upper clip eps_high (r > 1 + eps_high); with `verl_loss_mode` also "
    "verl's `clip_ratio_high`.",
}
"""Every role a parameter may play, and what reads it."""
# The roles several parameters of one recipe may play (each of them is set from the one axis).
SHARED_ROLES = frozenset({"delta"})
assert set(PARAM_ROLES) == set(get_args(ParamRole))
_ROLE_KINDS = {
    "delta": "float",
    "topk": "int",
    "ratio_cap": "float",
    "clip_low": "float",
    "clip_high": "float",
}

# verl 0.9.1's own policy-loss names (tests/verl checks this list against verl's registry). A
# recipe's loss is registered in verl under its name with `-` turned into `_`, prefixed `pdm_`
# where that would shadow one of verl's own losses.
VERL_OWN_LOSSES = frozenset(
    {
        "vanilla",
        "dppo_tv",
        "dppo_kl",
        "gspo",
        "sapo",
        "gpg",
        "clip_cov",
        "kl_cov",
        "geo_mean",
        "dro",
        "cispo",
        "bypass_mode",
    }
)

MaskFn = Callable[..., Any]
"""A recipe's own mask: ``fn(batch: RecipeBatch) -> bool [B, T]`` (True = gradient zeroed)."""
LossFn = Callable[..., Any]
"""A recipe's own per-token loss: ``fn(batch: RecipeBatch) -> [B, T]`` in ``batch.dtype``."""

ParamKind = Literal["float", "int", "str", "bool"]

_WRITES = (
    "writes into its batch in place: {} (a recipe's inputs are the backend's own tensors and "
    "read-only: compute a new tensor, e.g. `batch.advantages * 2`, not `batch.advantages.mul_(2)`)"
)


def _names(inputs: list[str]) -> str:
    return ", ".join(f"batch.{name}" for name in inputs)


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
    type: ParamKind | None = Field(
        None,
        description="Value type; None: inferred from the default (a float default, or bounds "
        "with a None default, make a float; an int default an integer).",
    )
    role: ParamRole | None = Field(
        None,
        description="What the parameter means to the platform beyond the recipe's own functions "
        f"(one of {sorted(PARAM_ROLES)}, see PARAM_ROLES); None: only the recipe reads it.",
    )

    @property
    def kind(self) -> ParamKind | None:
        """The value type (None: any value)."""
        if self.type is not None:
            return self.type
        d = self.default
        if isinstance(d, bool):
            return "bool"
        if isinstance(d, int):
            return "int"
        if isinstance(d, float) or (d is None and (self.ge is not None or self.le is not None)):
            return "float"
        if isinstance(d, str) or (d is None and self.choices is not None):
            return "str"
        return None

    def check(self, value: Any) -> str | None:
        """An error message if ``value`` is not allowed, else None."""
        if value is None:
            return None if self.default is None else "must be set"
        if self.choices is not None:
            return (
                None if value in self.choices else f"{value!r} is not one of {list(self.choices)}"
            )
        kind = self.kind
        if kind == "bool":
            return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
        if kind == "str":
            return None if isinstance(value, str) else f"expected a string, got {value!r}"
        if kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"expected a number, got {value!r}"
            if kind == "int" and not isinstance(value, int):
                return f"expected an integer, got {value!r}"
            if not math.isfinite(value):
                return f"must be a finite number, got {value!r}"
            if self.ge is not None and value < self.ge:
                return f"{value} is below the minimum {self.ge}"
            if self.le is not None and value > self.le:
                return f"{value} is above the maximum {self.le}"
        return None

    def normalise(self, value: Any) -> Any:
        """The value as trials store it: a float parameter given as an int becomes a float (the
        trial hash then does not depend on how the number was written)."""
        if self.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value


class Recipe(BaseModel):
    """A trust-region method, as declared by one file of ``recipes/``."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(
        description="Identity used in sweeps, MLflow tags and verl (`-` becomes `_`)."
    )
    display_name: str = Field(description="Short label for figure legends (cosmetic).")
    color: str = Field(description="Figure colour as #rrggbb, the same in every panel (cosmetic).")
    summary: str = Field(description="One line: what the method is (cosmetic).")
    launch: str | None = Field(
        None,
        description="How to launch it, when more than the sweeps that use it say (shown by "
        "`pdm recipes list -v` under the sweeps it finds; cosmetic).",
    )
    proximity: str | None = Field(
        None, description=f"Proximity test from the math API: one of {sorted(PROXIMITY_NAMES)}."
    )
    direction: str | None = Field(
        None, description=f"Direction test from the math API: one of {sorted(DIRECTION_NAMES)}."
    )
    mask: MaskFn | None = Field(
        None,
        description="Own per-token mask fn(batch: RecipeBatch) -> bool [B, T] (True = gradient "
        "zeroed), for methods that need new math; instead of proximity/direction.",
        exclude=True,
    )
    loss: LossFn | None = Field(
        None,
        description="Own per-token loss fn(batch: RecipeBatch) -> [B, T] in batch.dtype, "
        "differentiable through batch.log_prob; zeroed on masked and padding tokens and "
        "aggregated by the backend with verl's modes. None: -M r A (cap: the ratio_cap role).",
        exclude=True,
    )
    loss_sees_mask: bool = Field(
        False,
        description="The own `loss` handles masked tokens itself: it receives the mask as "
        "`batch.mask` and its value counts on every valid token, masked ones included (a "
        "penalty or bonus that must act where the policy-gradient term is masked). False: the "
        "loss is zeroed on masked tokens. Either way the logged masked share is the mask's.",
    )
    params: dict[str, Param] = Field(default_factory=dict, description="Tunable parameters.")
    needs: tuple[str, ...] = Field(
        (), description=f"Inputs a backend must supply: {sorted(KNOWN_INPUTS)}."
    )
    verl_loss_mode: str | None = Field(
        None,
        description="Set when the method *is* one of verl's own policy losses (e.g. `vanilla` "
        "for GRPO clip-higher): on VeRL it is then configuration only, its clip parameters "
        "(roles clip_low/clip_high) becoming verl's; the embedded backend runs the recipe.",
    )
    version: int = Field(
        1, description="Bump when the recipe's behaviour changes: it is part of trial identity."
    )

    # Set by the loader (recipe_files): where the recipe came from, for errors and provenance.
    _origin: str | None = PrivateAttr(None)  # the file as compiled (tracebacks name it)
    _line: int | None = PrivateAttr(None)  # line of `RECIPE = ...` in it
    _source: RecipeSource | None = PrivateAttr(None)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", v):
            raise ValueError("must be lower-case words joined by '-', e.g. 'my-method'")
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
        composed = self.proximity is not None or self.direction is not None
        if composed and self.mask is not None:
            raise ValueError("give `proximity` and `direction`, or an own `mask`, not both")
        if composed:
            if self.proximity is None or self.direction is None:
                raise ValueError("give both `proximity` and `direction`")
            if self.proximity not in PROXIMITY_NAMES:
                raise ValueError(
                    f"proximity {self.proximity!r} unknown; known: {sorted(PROXIMITY_NAMES)}"
                )
            if self.direction not in DIRECTION_NAMES:
                raise ValueError(
                    f"direction {self.direction!r} unknown; known: {sorted(DIRECTION_NAMES)}"
                )
        elif self.mask is None and self.loss is None:
            raise ValueError(
                "give `proximity` and `direction`, an own `mask` function, or an own `loss`"
            )
        if self.loss is not None and self.verl_loss_mode is not None:
            raise ValueError("an own `loss` cannot also be verl's own loss (`verl_loss_mode`)")
        if self.loss_sees_mask and self.loss is None:
            raise ValueError(
                "`loss_sees_mask` needs an own `loss` (the default loss never sees it)"
            )
        for pname, p in self.params.items():
            err = p.check(p.default) if p.default is not None else None
            if err:
                raise ValueError(f"params.{pname}.default: {err}")
        by_role: dict[str, str] = {}
        for pname, p in self.params.items():
            if p.role is None:
                continue
            if p.role in by_role and p.role not in SHARED_ROLES:
                raise ValueError(
                    f"params.{pname}: role {p.role!r} is already played by {by_role[p.role]!r}"
                )
            by_role[p.role] = pname
            if p.kind != _ROLE_KINDS[p.role]:
                raise ValueError(
                    f"params.{pname}: role {p.role!r} needs a {_ROLE_KINDS[p.role]} parameter, "
                    f"this one is {p.kind or 'untyped'}"
                )
        return self

    # -- roles -------------------------------------------------------------------------------

    def role_params(self, role: str) -> list[str]:
        """The names of the parameters playing ``role`` (see PARAM_ROLES), as declared: one at
        most, but for the roles in ``SHARED_ROLES``."""
        if role not in PARAM_ROLES:
            raise KeyError(f"unknown parameter role {role!r}; known: {sorted(PARAM_ROLES)}")
        return [name for name, p in self.params.items() if p.role == role]

    def role_param(self, role: str) -> str | None:
        """The name of the (first declared) parameter playing ``role``, None if none does."""
        return next(iter(self.role_params(role)), None)

    def role_value(self, role: str, params: Mapping[str, Any]) -> Any:
        """The value of the parameter playing ``role`` in ``params`` (None if no parameter
        plays it)."""
        name = self.role_param(role)
        return None if name is None else params.get(name)

    def with_roles(self, params: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the parameters of the given roles set (roles the recipe lacks, and
        None values, are ignored)."""
        out = dict(params)
        for role, value in values.items():
            for name in self.role_params(role) if value is not None else ():
                out[name] = self.params[name].normalise(value)
        return out

    @property
    def uses_delta(self) -> bool:
        """True when a parameter plays the ``delta`` role (the sweep's delta axis applies)."""
        return self.role_param("delta") is not None

    # -- where it runs -----------------------------------------------------------------------

    @property
    def verl_name(self) -> str:
        """verl's ``policy_loss.loss_mode`` for this method."""
        if self.verl_loss_mode:
            return self.verl_loss_mode
        snake = self.name.replace("-", "_")
        return f"pdm_{snake}" if snake in VERL_OWN_LOSSES else snake

    @property
    def source(self) -> RecipeSource | None:
        """The file's text and normalised-source hash as loaded (None if not loaded from one)."""
        return self._source

    @property
    def origin(self) -> str:
        """Where the recipe is declared, for messages: its file, else its name."""
        return self._origin or f"recipe {self.name}"

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
            else:
                resolved[k] = self.params[k].normalise(v)
        return resolved, errors

    def method(self, params: Mapping[str, Any]) -> Method:
        """The math API's :class:`~pdmask.trust_region.Method` with ``params`` bound.

        Any exception from the recipe's own functions, and any output that breaks the recipe
        contract, is raised as ``RecipeError`` naming the recipe's file, function and line.
        """
        from pdmask.trust_region import Method, composed_mask

        mask = self.mask
        if mask is None and self.proximity is not None:
            proximity, direction = self.proximity, self.direction
            kwargs = {
                keyword: self.role_value(role, params)
                for role, keyword in (
                    ("delta", "delta"),
                    ("clip_low", "eps_low"),
                    ("clip_high", "eps_high"),
                )
                if self.role_param(role) is not None
            }

            def mask(batch: RecipeBatch):
                return composed_mask(proximity, direction, batch.stats, batch.advantages, **kwargs)

        return Method(
            name=self.name,
            mask=self._guarded(mask, "mask"),
            loss=self._guarded(self.loss, "loss"),
            params=params,
            ratio_cap=self.role_value("ratio_cap", params),
            loss_sees_mask=self.loss_sees_mask,
            needs=frozenset(self.needs),
        )

    def _guarded(self, fn, kind: str):
        if fn is None:
            return None
        from pdmask.trust_region import hook_output_problem
        from pdmask.trust_region.write_guard import versions, written

        def hook(batch: RecipeBatch):
            before = versions(batch)
            try:
                out = fn(batch)
            except RecipeError:
                raise
            except Exception as err:
                line = self._line_in(err.__traceback__) or self.line_of(fn)
                message = f"raised {type(err).__name__}: {err}"
                raise RecipeError(Problem(self.origin, kind, message, line)) from err
            changed = written(batch, before)
            if changed:
                raise RecipeError(
                    Problem(
                        self.origin,
                        kind,
                        _WRITES.format(_names(changed)),
                        self._write_line(fn, batch),
                    )
                )
            problem = hook_output_problem(kind, out, batch)
            if problem is not None:
                raise RecipeError(Problem(self.origin, kind, problem, self.line_of(fn)))
            return out

        hook.__name__ = hook.__qualname__ = f"{self.name}.{kind}"
        return hook

    def _write_line(self, fn, batch: RecipeBatch) -> int | None:
        """The line of ``fn``'s first in-place write into its batch (else where ``fn`` is)."""
        from pdmask.trust_region.write_guard import first_write

        caught = first_write(fn, batch)
        line = None if caught is None else self._line_in(caught.__traceback__)
        return line or self.line_of(fn)

    def _line_in(self, tb) -> int | None:
        """The deepest line of the recipe's file in a traceback."""
        frames = [f for f in traceback.extract_tb(tb) if f.filename == self._origin]
        return frames[-1].lineno if frames else None

    def line_of(self, fn) -> int | None:
        """The line where ``fn`` is defined in the recipe's file (else the ``RECIPE`` line)."""
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename == self._origin:
            return code.co_firstlineno
        return self._line
