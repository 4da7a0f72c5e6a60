"""What one token-level analysis run is: its knobs, the training setting it starts from, its hash.

The training setting (method, model, precision, delta, budget profile) comes from a sweep of the
registry, ``token-analysis`` by default, whose grid must have exactly one cell: that is the training
the analysis reproduces, seed by seed. Everything that changes a number in the results enters the
config hash, which names the output folder and keys the per-seed cache, so a rerun with the same
flags resumes and a rerun with different flags starts a separate analysis.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pdmask.errors import ConfigError, ValidationFailed, validation_problems

# Bump when the protocol or the recorded quantities change: cached seeds of older versions are
# then ignored instead of being mixed into a new table.
ANALYSIS_VERSION = 6  # 6: pdm-2nd's second-order test; responses of variable length

OptimizerName = Literal["adamw", "sgd"]


class TokenAnalysisConfig(BaseModel):
    """The flags of ``pdm analyze tokens`` (all optional; the defaults reproduce the paper's table)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sweep: str = Field(
        "token-analysis",
        description="Registry sweep whose single grid cell is the training setting to analyse; its "
        "name is also the MLflow experiment of the analysis run.",
    )
    profile: str | None = Field(
        None, description="Embedded-backend budget profile; None = the sweep's."
    )
    seeds: int = Field(61, gt=0, description="How many seeds (training runs) to analyse.")
    first_seed: int = Field(0, ge=0, description="Seeds are first_seed .. first_seed+seeds-1.")
    delta: float | None = Field(
        None,
        gt=0,
        description="Proximity threshold of the analysis (token out of region when D_t > delta); "
        "None = the trial's delta. The training before the analysed minibatch keeps the trial's.",
    )
    optimizers: tuple[OptimizerName, ...] = Field(
        ("adamw", "sgd"),
        min_length=1,
        description="Optimizers of the one measured step: adamw (the trial's AdamW with the state "
        "training left) and/or sgd (plain gradient step, what Ddot describes).",
    )
    train_steps: int = Field(
        20,
        ge=0,
        description="Full RL steps of the trial (its recipe's mask) before the analysed rollout, so "
        "pi and the optimizer state are as training leaves them.",
    )
    prompts: int | None = Field(
        1024,
        gt=0,
        description="Prompts of the analysed rollout (x group size responses); its last minibatch is "
        "analysed. None = the profile's prompts_per_step. Larger gives more tokens per seed.",
    )
    minibatches: int | None = Field(
        8,
        gt=0,
        description="Minibatches of the analysed rollout, trained one after the other with the "
        "trial's mask (minibatch i lags mu by i - 1 updates). None = the profile's. 8 minibatches "
        "of a 1024-prompt rollout resemble the paper's VeRL steps (large batch, many minibatches).",
    )
    analysed_minibatches: int = Field(
        2,  # the last two: ~200 disagreeing tokens per seed on the stress setting (one: ~63)
        gt=0,
        description="How many of the rollout's last minibatches are analysed, each from its own "
        "saved state (the parameters and optimizer state training reaches just before that "
        "minibatch's update; after the analysis the real update is made and training goes on). "
        "More gives more tokens per seed at proportional cost; the earliest minibatches hardly "
        "leave the region.",
    )
    split: Literal["sequences", "groups"] = Field(
        "sequences",
        description="How the analysed rollout is cut into minibatches: shuffled sequences (as the "
        "sim trainer does; a GRPO group's responses land in different minibatches) or whole groups "
        "(each prompt's responses stay together).",
    )
    sgd_lr: float | None = Field(
        None,
        gt=0,
        description="Learning rate of the SGD step; None = matched per seed so the SGD step moves "
        "log pi (RMS over the analysed tokens) as far as the AdamW step of the ratio test does.",
    )
    isolated_tokens: int = Field(
        32,
        ge=0,
        description="Out-of-region tokens per seed given an isolated single-token SGD step (the "
        "token's own gradient only), to check the derivative apart from cross-token effects.",
    )
    tie_tol: float = Field(
        2e-4,
        ge=0,
        description="|change of D_t| at or below this counts as unchanged (neither grew nor shrank). "
        "Must stay above the float32 rounding of the change, which every seed measures against "
        "a float64 recomputation (the report states both): up to ~3e-5 measured on the stress "
        "profile's states (both task regimes), against a median change of ~0.07.",
    )

    def config_hash(self, setting: dict[str, Any]) -> str:
        """Hash of every field that shapes the results plus the resolved training ``setting``."""
        identity = {"version": ANALYSIS_VERSION, "config": self.model_dump(mode="json")}
        identity["config"].pop("seeds")  # more seeds extend an analysis; they do not change one
        identity["config"].pop("first_seed")
        identity["setting"] = setting
        canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    @classmethod
    def from_flags(cls, values: dict[str, Any]) -> TokenAnalysisConfig:
        """Validate command-line values; every problem at once, each naming its flag."""
        try:
            return cls.model_validate({k: v for k, v in values.items() if v is not None})
        except ValidationError as err:
            problems = validation_problems(
                err,
                "command line",
                field_of=lambda loc: "--" + str(loc[0]).replace("_", "-") if loc else "<flags>",
            )
            raise ValidationFailed(problems) from None


def parse_optimizers(text: str) -> tuple[str, ...]:
    """``adamw``, ``sgd``, ``both`` or a comma list into the optimizers tuple."""
    names = ("adamw", "sgd") if text == "both" else tuple(p.strip() for p in text.split(","))
    bad = [n for n in names if n not in ("adamw", "sgd")]
    if bad or not names:
        raise ConfigError(f"--optimizer: expected adamw, sgd or both, got {text!r}")
    return tuple(dict.fromkeys(names))
