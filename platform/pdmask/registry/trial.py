"""A trial: one fully resolved, hashable training run, its recipe's code included."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pdmask.registry.catalog import PRECISIONS, PrecisionName
from pdmask.registry.recipe_source import RecipeSource
from pdmask.registry.sim_knobs import knob_tag, knobs_label

if TYPE_CHECKING:
    from pdmask.registry.recipes import Recipe

# What never changes what is trained: excluded from the identity hash. Of the recipe's source only
# its normalised-code hash counts (the file's name and its comments do not).
COSMETIC_FIELDS: dict[str, Any] = {"sweep": True, "recipe_source": {"file": True, "text": True}}
# The identity without the recipe's code: equal for a trial whose recipe file was edited, so the
# plan can say *why* a trial is to do again.
CODE_FIELDS = frozenset({"recipe_source", "recipe_version"})


def _digest(data: dict[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class Trial(BaseModel):
    """Everything a backend needs to run one trial. Its ``trial_hash`` is its identity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sweep: str = Field(
        description="Sweep that planned it (the MLflow experiment); not part of identity."
    )
    method: str = Field(description="Recipe name, e.g. `pdm-agg`.")
    recipe_version: int = Field(
        description="The recipe's `version` (bumped when its behaviour changes)."
    )
    recipe_source: RecipeSource = Field(
        description="The recipe file as read when the sweep was planned: what this trial trains, "
        "wherever it runs (the hash of its normalised code is part of identity)."
    )
    params: dict[str, Any] = Field(
        description="The recipe's parameters, defaults resolved (delta included)."
    )
    model: str = Field(description="Registry model, e.g. `qwen3-4b-base`.")
    precision: PrecisionName = Field(description="Precision setting (`registry/catalog.py`).")
    delta: float | None = Field(
        description="Trust-region size: the value of the recipe's `delta`-role parameter; None "
        "for a recipe without one (never crossed with a sweep's delta axis)."
    )
    seed: int = Field(description="Random seed of the whole trial.")
    backend: str = Field(description="Training backend: a name of `registry/backends.py`.")
    profile: str | None = Field(
        description="Budget profile (`smoke`, `default`, `full`, `stress`) of a backend that has "
        "them (`BackendSpec.settings`); None on one that has none (VeRL)."
    )
    steps: int | None = Field(
        None,
        description="RL steps the sweep sets (None: the backend's own, the profile's on the "
        "embedded backend, 300 on VeRL: `Backend.planned_steps` says how many it trains).",
    )
    mu_source: Literal["rollout", "recompute"] = Field(
        "rollout",
        description="Where mu's top-K comes from: the rollout engine, or the trainer's old-policy forward.",
    )
    sim: dict[str, Any] = Field(
        default_factory=dict,
        description="Embedded-backend knobs the cell sets (`sim.<knob>` axes, "
        "pdmask.registry.sim_knobs.SimKnobs), canonical values, only those set.",
    )

    def identity(self) -> dict[str, Any]:
        """The semantic content that defines the trial (what the hash covers)."""
        identity = self.model_dump(mode="json", exclude=COSMETIC_FIELDS)
        if not identity["sim"]:  # a trial that sets no knob keeps the hash it had before knobs
            del identity["sim"]
        return identity

    @property
    def trial_hash(self) -> str:
        """sha256 of the canonical JSON of ``identity()``: stable across processes and machines."""
        return _digest(self.identity())

    @property
    def config_hash(self) -> str:
        """The hash of the identity without the recipe's code (``recipe_source``, ``version``):
        a run with this hash and another trial hash trained an earlier version of the recipe."""
        return _digest({k: v for k, v in self.identity().items() if k not in CODE_FIELDS})

    @property
    def cell_hash(self) -> str:
        """The trial's setting: the cell of a figure panel that its seeds sample, identified by
        the hash of its identity without the seed (the method with its parameters and code,
        model, precision, delta, the source of mu, the embedded knobs, backend, budget). The
        sweep's canary and fail-fast act per setting (``orchestration/canary.py``)."""
        return _digest({k: v for k, v in self.identity().items() if k != "seed"})

    def cell_name(self) -> str:
        """The setting as a name: the run name without its seed."""
        delta = "" if self.delta is None else f"-d{self.delta:g}"
        varied = "".join(f"-{name}{_short(value)}" for name, value in self.varied_params().items())
        knobs = "".join(f"-{knob}{knob_tag(value)}" for knob, value in sorted(self.sim.items()))
        return f"{self.method}{varied}-{self.setting}{delta}{knobs}"

    def recipe(self) -> Recipe:
        """The recipe this trial trains, executed from the source it carries (never re-read
        from disk: an edit after planning does not reach this trial)."""
        from pdmask.registry.recipe_files import recipe_from_source

        return recipe_from_source(f"recipes/{self.recipe_source.file}", self.recipe_source.text)

    @property
    def setting(self) -> str:
        """Panel key, e.g. `4b-bf16`, `30b-fp8-e2e`."""
        size = self.model.removeprefix("qwen3-").removesuffix("-base").replace("-a3b", "")
        return f"{size}-{self.precision}"

    def tags(self) -> dict[str, str]:
        """The `pdm.*` MLflow tags of the run contract (design.md)."""
        return {
            "pdm.sweep": self.sweep,
            "pdm.trial_hash": self.trial_hash,
            "pdm.method": self.method,
            # the method as tables show it: a control or a varied parameter is never a plain row
            "pdm.method_label": self.method_label(),
            "pdm.model": self.model,
            "pdm.precision": self.precision,
            # what the setting is on this backend (fp8-e2e trains in BF16 on VeRL)
            "pdm.precision_label": self.precision_label(),
            "pdm.setting": self.setting,
            "pdm.delta": "" if self.delta is None else repr(float(self.delta)),
            "pdm.seed": str(self.seed),
            "pdm.backend": self.backend,
            "pdm.profile": self.profile or "",
            "pdm.mu_source": self.mu_source,
            "pdm.recipe_hash": self.recipe_source.hash,
            "pdm.recipe_file": self.recipe_source.file,
            "pdm.config_hash": self.config_hash,
            **{f"pdm.sim.{knob}": knob_tag(value) for knob, value in self.sim.items()},
        }

    def varied_params(self) -> dict[str, Any]:
        """The recipe's parameters this trial sets away from their defaults, by name (delta
        aside: it has its own axis, tag and place in the run name; a second delta-role parameter
        set apart from the trial's delta is a varied parameter like any other)."""
        declared = self.recipe().params
        return {
            name: value
            for name, value in sorted(self.params.items())
            if name in declared
            and declared[name].default != value
            and not (declared[name].role == "delta" and value == self.delta)
        }

    def method_label(self) -> str:
        """The method as tables show it: with the parameters it varies and what the cell's
        embedded knobs make of it, e.g. ``k3-penalty (beta = 0.1)``."""
        varied = [f"{name} = {value}" for name, value in self.varied_params().items()]
        knobs = knobs_label(self.sim)
        extra = ", ".join([*varied, *([knobs] if knobs else [])])
        return f"{self.method} ({extra})" if extra else self.method

    def precision_label(self, engine: str | None = None) -> str:
        """The precision setting as what it is on this trial's backend (catalog ``PRECISIONS``),
        trained on ``engine`` where the backend has several (verl: ``catalog.training_engine``)."""
        return PRECISIONS[self.precision].label_on(self.backend, engine)

    def description(self) -> str:
        """One sentence on what the run is (its description in the MLflow UI)."""
        delta = "" if self.delta is None else f", delta {self.delta:g}"
        precision = f"{self.precision} ({self.precision_label()})"
        budget = f" ({self.profile} profile)" if self.profile else ""
        return (
            f"{self.method_label()} on {self.model}, {precision}{delta}, seed {self.seed}: "
            f"a trial of sweep {self.sweep} on the {self.backend} backend{budget}."
        )

    def run_name(self) -> str:
        """Human-readable run name (display only: identity is the hash tag)."""
        return f"{self.cell_name()}-s{self.seed}"
