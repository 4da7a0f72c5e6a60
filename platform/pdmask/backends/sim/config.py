"""``SimTrialConfig``: everything one ``sim`` trial needs besides the recipe's mask.

The profile fixes the budget; any knob left ``None`` takes the profile's value (see
:meth:`SimTrialConfig.resolved`), so a sweep can override one knob without restating the profile.
The knobs a sweep may set per cell (``sim.<knob>`` axes: the task regime, the learning rate) are
declared once, in the registry's :class:`~pdmask.registry.sim_knobs.SimKnobs`, which this config
inherits.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field, ValidationError, model_validator

from pdmask.backends.sim.specs import PROFILES, STAND_INS, ProfileSpec, StandInSpec
from pdmask.backends.sim.task import TASKS, AdditionTask
from pdmask.errors import ValidationFailed, validation_problems
from pdmask.registry.catalog import PrecisionName
from pdmask.registry.sim_knobs import SimKnobs

StandInName = Literal[tuple(STAND_INS)]  # type: ignore[valid-type]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
ProfileName = Literal[tuple(PROFILES)]  # type: ignore[valid-type]
LossAggMode = Literal[  # = pdmask.trust_region.AGG_MODES (a test checks)
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


class SimTrialConfig(SimKnobs):
    """One trial of the embedded CPU backend: stand-in, precision setting, budget, seed; the task
    regime and learning rate come from :class:`SimKnobs`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stand_in: StandInName = Field(
        description="Model stand-in (STAND_INS): tiny-4b, tiny-8b or tiny-30b-a3b (a small MoE)."
    )
    precision: PrecisionName = Field(
        description="Training/inference mismatch setting. bf16: trainer fp32, behaviour bf16. "
        "fp8-rollout: behaviour weights and activations rounded to float8 e4m3. fp8-e2e: the "
        "training forward is FP8-emulated as well (finer scaling than the behaviour's)."
    )
    profile: ProfileName = Field(
        "default",
        description="Budget preset (PROFILES): smoke (seconds), default (<~50 s), full, stress "
        "(8 stale minibatches at lr 1e-3: the trust region binds; <~60 s on tiny-4b).",
    )
    seed: int = Field(description="Trial seed: rollouts, minibatch order and evaluation samples.")
    delta: float = Field(
        gt=0,
        description="Trust-region delta of the logged diagnostics (out-of-region share, "
        "direction-test disagreement): the trial's (``sim_config``). The mask itself comes from "
        "the recipe's mask_fn.",
    )
    top_k: int = Field(
        20, ge=0, description="How many behaviour log-probs the trainer sees (vLLM exposes 20)."
    )
    fp8_scaling: Literal["per-tensor", "per-channel"] = Field(
        "per-tensor", description="Scaling granularity of the behaviour copy's FP8 weights."
    )
    steps: int | None = Field(None, gt=0, description="RL steps; None = the profile's.")
    prompts_per_step: int | None = Field(
        None, gt=0, description="Prompts per rollout batch; None = the profile's."
    )
    group_size: int | None = Field(
        None, ge=2, description="Samples per prompt (GRPO group); None = the profile's."
    )
    minibatches: int | None = Field(
        None, gt=0, description="Optimizer updates per rollout batch; None = the profile's."
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of the RL phase.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clipping threshold.")
    loss_agg_mode: LossAggMode = Field("token-mean", description="verl's loss aggregation mode.")
    ratio_cap: float | None = Field(
        None,
        ge=1.0,
        description="Truncated-IS cap C of the recipe (loss uses min(r, C)); None: no cap.",
    )
    eval_every: int | None = Field(
        None, gt=0, description="Evaluate every this many steps; None = the profile's."
    )
    eval_problems: int | None = Field(
        None, gt=0, description="Held-out problems scored avg@16; None = the profile's."
    )
    eval_samples: int = Field(16, gt=0, description="Samples per evaluation problem (avg@16).")
    checkpoint_every: int | None = Field(
        None, gt=0, description="Checkpoint every this many steps; None = the profile's."
    )
    base_model: Literal["stand-in", "quick"] | None = Field(
        None,
        description="Warm start of the base model: 'stand-in' (full recipe) or 'quick' (30 "
        "steps, for smoke runs); None = the profile's.",
    )
    cache_dir: str | None = Field(
        None,
        description="Where base models are cached; None = <state dir>/cache/sim. Does not change "
        "results.",
    )

    @model_validator(mode="after")
    def _batch_splits_evenly(self) -> SimTrialConfig:
        budget = self.resolved()
        sequences = budget.prompts_per_step * budget.group_size
        if sequences % budget.minibatches:
            raise ValueError(
                f"prompts_per_step * group_size = {sequences} is not divisible by "
                f"minibatches = {budget.minibatches}"
            )
        pool = self.task_spec.eval_pool()[0].shape[0]
        if budget.eval_problems > pool:
            raise ValueError(
                f"eval_problems = {budget.eval_problems} exceeds the {pool} held-out problems"
            )
        return self

    @property
    def stand_in_spec(self) -> StandInSpec:
        return STAND_INS[self.stand_in]

    @property
    def task_spec(self) -> AdditionTask:
        return TASKS[self.task]

    @property
    def learns(self) -> bool:
        """False for the lr = 0 mismatch control: no update can move the parameters."""
        return self.resolved().lr > 0

    def resolved(self) -> ProfileSpec:
        """The profile with this config's overrides applied."""
        base = PROFILES[self.profile]
        overrides = {
            name: getattr(self, name)
            for name in ProfileSpec.model_fields
            if name in type(self).model_fields and getattr(self, name) is not None
        }
        return base.model_copy(update=overrides)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, file: str = "<trial config>") -> SimTrialConfig:
        """Validate ``data``; every problem at once as ``ValidationFailed`` naming ``file``."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ValidationFailed(validation_problems(err, file, whole="<root>")) from None
