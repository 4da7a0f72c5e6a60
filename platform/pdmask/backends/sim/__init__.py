"""``sim``: the embedded CPU training backend (real GRPO on a small transformer, no GPU needed).

A small decoder-only transformer per model stand-in (``STAND_INS``) learns a verifiable synthetic
task, two-digit addition, in one of two token regimes (``task.TASKS``, the ``task`` knob): by
default each digit has ~100 interchangeable tokens (logits 1,025 wide, the top-20 view holds
about half the mass); ``llm-like`` has two forms per digit and 4,071 rare filler tokens (logits
4,096 wide, top-20 mass > 99 % with a long thin tail, like an LLM's). A supervised warm start makes each stand-in's
base model (``prepare_base_model``: cached per stand-in, built once under a file lock; avg@16 about
0.1-0.2). GRPO then trains it with the recipe's mask through the same math API the VeRL backend
uses. A behaviour copy in bf16 or FP8 does the rollouts and exposes only its top-20 log-probs and
the sampled token's log-prob, as vLLM would; stale minibatch updates add the policy lag.

Contract (the sweep runner and the registry call this):

- ``train_trial(cfg, *, mask_fn, reporter, workdir, should_stop, note)`` runs one trial, deterministic
  given ``cfg.seed`` on one machine, single-threaded. ``mask_fn`` is the recipe's
  ``pdmask.trust_region.Method`` (its mask and per-token loss, ``Recipe.method(params)``). ``reporter(step, metrics)`` is called at step 0 (the base
  model's evaluation only) and once per RL step 1..steps; evaluation steps (every ``eval_every``
  and the last) carry ``val-core/synth/acc/mean_at_16``. Checkpoints go to ``workdir`` every
  ``checkpoint_every`` steps, at the end and when ``should_stop()`` turns true; a rerun resumes
  after the checkpoint's step (steps between the last checkpoint and a kill are reported again);
  an unreadable checkpoint is moved aside and the trial resumes from the one before it or from
  scratch, ``note(line)`` (default: stderr) told which (``checkpoint``).
  Raises ``TrialFailed`` on a non-finite loss. Returns the last step's metrics plus
  ``sim/base_acc_mean_at_16``, ``sim/steps_done``, ``sim/stopped``, ``sim/wall_s``. Per step it
  logs ``actor/entropy`` (verl's name and meaning), the trust-region diagnostics
  ``actor/pdm/*``, the ratio quantiles ``actor/pdm/ratio_p01|p50|p99`` and the mismatch KL.
- The knobs a sweep may set per cell (``sim.<knob>`` axes) are ``SimKnobs`` of the registry:
  ``task`` and ``lr`` (``lr = 0`` is the mismatch control: nothing is learned).
- ``build_analysis_setup(cfg, ...)`` gives the token-level analysis a trainer, behaviour copy,
  optimizer and a rollout batch with everything the math API needs.

Modules: ``task`` (problems, reward), ``model`` (the transformer, MoE), ``fp8`` / ``precision``
(the mismatch settings), ``rollout`` (sampling, top-K view), ``grpo`` (advantages, trainer-side
statistics), ``warmstart`` (base models), ``state`` / ``checkpoint`` (trial state, resume),
``trainer`` (the loop), ``evaluation`` (avg@16), ``analysis`` (the building block), ``specs`` /
``config`` (presets and the trial config), ``runtime`` (one thread, deterministic kernels).
"""

import importlib

# Resolved on first use: the backend's runtime (``backend.py``) is loaded by a driver that only
# checks and plans, which must not pay for torch and the trainer.
_HOMES = {
    "AnalysisSetup": "analysis",
    "build_analysis_setup": "analysis",
    "PRECISIONS": "config",
    "SimTrialConfig": "config",
    "EVAL_METRIC": "evaluation",
    "PROFILES": "specs",
    "STAND_INS": "specs",
    "ProfileSpec": "specs",
    "StandInSpec": "specs",
    "train_trial": "trainer",
    "prepare_base_model": "warmstart",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
