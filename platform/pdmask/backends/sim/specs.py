"""Presets: the model stand-ins (one per registry model) and the compute profiles.

The stand-ins grow like the paper's models (Qwen3-4B-Base < 8B-Base < 30B-A3B-Base); the 30B one
is a small mixture of experts (8 experts, 2 active per token) to mirror A3B. Each carries its own
warm-start recipe, which makes its "base model" (see ``warmstart.py``).

Profiles size a trial: ``smoke`` runs in seconds (tests), ``default`` keeps a trial short enough
that the default ``main-figure`` sweep (60 trials: 16 cells and 4 lr = 0 controls, 3 seeds, 2 at a
time on 2 cores) finishes within 15 minutes, ``full`` gives smoother curves. ``stress`` makes the trust region bind (more
stale updates per rollout and larger steps; see its comment) for the ``stress-figure`` sweep.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StandInSpec(BaseModel):
    """Architecture and warm start of one model stand-in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Stand-in name, as the registry's models refer to it.")
    mirrors: str = Field(description="The real model this stands in for.")
    d_model: int = Field(description="Residual stream width.")
    n_layers: int = Field(description="Number of transformer blocks.")
    n_heads: int = Field(description="Attention heads per block.")
    d_ff: int = Field(description="Hidden width of each MLP (of each expert for MoE).")
    n_experts: int = Field(1, description="Experts per MoE layer; 1 means a dense MLP.")
    experts_per_token: int = Field(1, description="Experts routed per token (top-k).")
    warmstart_max_steps: int = Field(
        1500, description="Cap on the warm start's clean phase (it stops once the task is learned)."
    )
    warmstart_target_acc: float = Field(
        0.97, description="Clean phase ends when this share of a batch is right in every digit."
    )
    warmstart_noisy_steps: int = Field(
        200, description="Steps of the noisy phase that makes sampled answers often wrong."
    )
    warmstart_noise: float = Field(
        0.4, description="Probability that a noisy-phase answer digit is replaced at random."
    )
    warmstart_batch: int = Field(128, description="Demonstrations per warm-start step.")
    warmstart_lr: float = Field(3e-3, description="Peak learning rate of the warm start.")


class ProfileSpec(BaseModel):
    """How much RL a trial does and how often it evaluates and checkpoints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(description="RL steps (one rollout batch each).")
    prompts_per_step: int = Field(description="Prompts per rollout batch.")
    group_size: int = Field(description="Samples per prompt (GRPO group size G).")
    minibatches: int = Field(
        description="Optimizer updates per rollout batch; updates after the first are stale."
    )
    lr: float = Field(description="AdamW learning rate of the RL phase.")
    eval_every: int = Field(description="Evaluate avg@16 every this many steps (plus 0 and last).")
    eval_problems: int = Field(description="Held-out problems in the avg@16 evaluation.")
    checkpoint_every: int = Field(description="Write a checkpoint every this many steps.")
    base_model: Literal["stand-in", "quick"] = Field(
        "stand-in",
        description="Warm start of the base model: the stand-in's full recipe, or a quick "
        "30-step one (smoke runs; that model barely knows the task).",
    )


STAND_INS: dict[str, StandInSpec] = {
    s.name: s
    for s in [
        StandInSpec(
            name="tiny-4b",
            mirrors="Qwen3-4B-Base",
            d_model=64,
            n_layers=2,
            n_heads=4,
            d_ff=256,
        ),
        StandInSpec(
            name="tiny-8b",
            mirrors="Qwen3-8B-Base",
            d_model=64,
            n_layers=3,
            n_heads=4,
            d_ff=256,
        ),
        StandInSpec(
            name="tiny-30b-a3b",
            mirrors="Qwen3-30B-A3B-Base",
            d_model=64,
            n_layers=2,
            n_heads=4,
            d_ff=128,
            n_experts=8,
            experts_per_token=2,
        ),
    ]
}

PROFILES: dict[str, ProfileSpec] = {
    # Small, but it must train: from the quick base model every reward was 0, so every
    # advantage, gradient and masked fraction was 0 and a training bug could not show. The
    # stand-in's base model (built once per cache, then shared with every profile) solves ~10 %;
    # groups of 8 give non-zero advantages at every step, and 3 stale minibatches of 4 make the
    # trust region bind (measured on tiny-4b: masked 1-7 % of tokens at most steps, ~1 s CPU
    # per trial after the base model).
    "smoke": ProfileSpec(
        steps=4,
        prompts_per_step=8,
        group_size=8,
        minibatches=4,
        lr=1e-3,
        eval_every=2,
        eval_problems=8,
        checkpoint_every=2,
        base_model="stand-in",
    ),
    # The figures' budget: 60 trials of `main-figure` (3 seeds and the controls) within 15
    # minutes on 2 cores, base models included. Measured per trial, two at a time on 2 cores:
    # ~17 s on tiny-4b, ~28 s on tiny-30b-a3b, of which evaluation 2-3 s; avg@16 0.15 -> 0.82 on
    # tiny-4b/bf16 (120 steps at lr 3e-4 reached 0.89 in twice the time). The step count sets
    # the time: a step's fixed costs (four optimizer updates, the weight sync) make halving the
    # batch only 1.4x faster.
    "default": ProfileSpec(
        steps=50,
        prompts_per_step=32,
        group_size=8,
        minibatches=4,
        lr=6e-4,
        eval_every=5,
        eval_problems=48,
        checkpoint_every=10,
    ),
    "full": ProfileSpec(
        steps=400,
        prompts_per_step=64,
        group_size=8,
        minibatches=4,
        lr=5e-4,
        eval_every=20,
        eval_problems=160,
        checkpoint_every=20,
    ),
    # Stresses the off-policy part: twice the stale updates per rollout batch (8 minibatches of
    # 32 sequences: 7 of 8 updates stale) at 3.3x the default learning rate, so the stale policy
    # drifts as far as the region allows. At `default` the region hardly binds (masked 0.1-2 %,
    # stale top-K KL ~0.002 against delta = 0.15) and all methods coincide; here the last
    # minibatch's top-K KL is ~0.15-0.3 (of the order of delta) and 4-7 % of tokens are masked on
    # tiny-4b/bf16; on tiny-30b-a3b/fp8-rollout the precision mismatch also grows ~10x
    # (mismatch KL ~0.01-0.02). Chosen for the masked fraction, not for a winner. Measured (2-4
    # seeds, 120 steps; ~20 s per trial on tiny-4b, ~40 s on tiny-30b-a3b, one core): the methods
    # separate, but GRPO clip-higher's tighter effective region wins (4b/bf16 final avg@16 ~0.73
    # against ~0.52-0.58 for the top-K KL methods) and on 30b/fp8-rollout every method collapses
    # (GRPO later); pdm-agg/pdm-uni do not separate from dppo-topk-kl beyond seed noise.
    "stress": ProfileSpec(
        steps=120,
        prompts_per_step=32,
        group_size=8,
        minibatches=8,
        lr=1e-3,
        eval_every=10,
        eval_problems=96,
        checkpoint_every=10,
    ),
}
