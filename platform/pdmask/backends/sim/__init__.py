"""``sim``: the embedded CPU training backend (real GRPO on a small transformer, no GPU needed).

A small decoder-only transformer per model stand-in (``STAND_INS``) learns a verifiable synthetic
task (multi-digit addition with many surface forms per digit, ``task.py``): a short supervised warm
start makes its base model (``prepare_base_model``, cached and locked), then GRPO trains it with
the recipe's trust-region mask through the same math API the VeRL backend uses. A behaviour copy
in bf16 or FP8 (``precision.py``) does the rollouts and exposes only its top-20 log-probs, as vLLM
would; stale minibatch updates add the policy lag. Budgets come from ``PROFILES``.

Contract (the sweep runner and the registry call this):

- ``train_trial(cfg, *, mask_fn, reporter, workdir, should_stop)`` runs one trial, deterministic
  given ``cfg.seed`` on one machine, single-threaded. ``mask_fn(stats, advantages) -> bool`` is the
  recipe's mask (True = gradient zeroed). ``reporter(step, metrics)`` is called at step 0 (the base
  model's evaluation) and once per RL step 1..steps; evaluation steps carry
  ``val-core/synth/acc/mean_at_16``. Checkpoints go to ``workdir`` every ``checkpoint_every`` steps
  (and at the end, and when ``should_stop()`` turns true); a rerun resumes after the checkpoint's
  step, so steps after the last checkpoint of a killed run are reported again. Raises
  ``TrialFailed`` on a non-finite loss. Returns the last step's metrics plus
  ``sim/base_acc_mean_at_16``, ``sim/steps_done``, ``sim/stopped``, ``sim/wall_s``.
- ``build_analysis_setup(cfg, ...)`` gives the token-level analysis a trainer, behaviour copy,
  optimizer and a rollout batch with everything the math API needs.
"""

from pdmask.backends.sim.analysis import AnalysisSetup, build_analysis_setup
from pdmask.backends.sim.config import PRECISIONS, SimTrialConfig
from pdmask.backends.sim.evaluation import EVAL_METRIC
from pdmask.backends.sim.specs import PROFILES, STAND_INS, ProfileSpec, StandInSpec
from pdmask.backends.sim.trainer import train_trial
from pdmask.backends.sim.warmstart import prepare_base_model

__all__ = [
    "EVAL_METRIC",
    "PRECISIONS",
    "PROFILES",
    "STAND_INS",
    "AnalysisSetup",
    "ProfileSpec",
    "SimTrialConfig",
    "StandInSpec",
    "build_analysis_setup",
    "prepare_base_model",
    "train_trial",
]
