"""How to launch one trial as a VeRL job: its Hydra overrides and its environment (pure functions).

``verl_overrides`` gives the ``key=value`` overrides of ``python -m verl.trainer.main_ppo``;
``job_env`` the variables of the Ray job's runtime env (plugin module, MLflow run).

The job builder adds what is not pdmask's to decide here (data files, reward function, batch
sizes, learning rate...) through ``extra``; an ``extra`` key replaces a generated one of the same
name. Every trial runs on pdmask's trainer (``pdm_sync``), so every run gets the same start-up
checks, MLflow tags and FAILED status, a method that is verl's own loss included.

Precisions on verl 0.9.1 (what it supports, found in its code):

- ``bf16``: vLLM in bf16, FSDP training in bf16 mixed precision.
- ``fp8-rollout``: vLLM quantizes the synced bf16 weights to FP8 on load (``rollout.quantization=fp8``,
  blockwise FP8); training stays bf16. This is the paper's "FP8 rollout only".
- ``fp8-e2e``: as far as 0.9.1 allows for pdmask's methods. FP8 *training* exists in verl 0.9.1
  only on the Megatron engine (TransformerEngine) and the nemo-automodel engine; neither gives
  pdmask's logits hook the full logits (Megatron's are vocab-parallel, automodel has no hook), and
  the FSDP engine trains in bf16/fp16 only. So ``fp8-e2e`` here makes the *whole rollout* FP8 --
  FP8 weights plus an FP8 KV cache (``engine_kwargs.vllm.kv_cache_dtype=fp8``) -- with bf16
  training. It is a stronger training-inference mismatch than ``fp8-rollout``, not the paper's
  FP8 training; results must be labelled accordingly.
"""

from __future__ import annotations

import json
from typing import Any

from pdmask.backends.verl.checks import AGENT_LOOP, TRAINER_NAME, VLLM_DEFAULT_MAX_LOGPROBS
from pdmask.backends.verl.loss_names import MU_SOURCES
from pdmask.backends.verl.node_requirements import ATTENTION_KEY, FLASH_ATTENTION
from pdmask.console import QUIET_MLFLOW
from pdmask.errors import Problem, ValidationFailed
from pdmask.registry.catalog import PRECISIONS as CATALOG_PRECISIONS
from pdmask.registry.engine_rules import ROLLOUT_NUMERICS

PRECISIONS = tuple(CATALOG_PRECISIONS)
PLUGIN_MODULE = "pdmask.backends.verl.plugin"
POLICY_LOSS_CONFIG = "pdmask.backends.verl.config.PDMPolicyLossConfig"
# A recipe that is verl's vanilla clipped surrogate runs it with the recipe's clip parameters
# (roles clip_low / clip_high). verl's dual clip (a constant loss for A < 0 and r > clip_ratio_c) is
# pushed out of reach so the gradient is the recipe's exactly (tests/verl/test_loss_path.py).
NATIVE_DUAL_CLIP_OFF = {"clip_ratio_c": 1.0e9}

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.rollout"
_PL = f"{_A}.policy_loss"


def _value(v: Any) -> str:
    """A Hydra override value."""
    if isinstance(v, bool):
        return "True" if v else "False"
    if v is None:
        return "null"
    if isinstance(v, list | tuple):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, str) and any(c in v for c in " ,=[]{}()'\"\\$"):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(v)


def _project_recipe(method: str, problems: list[Problem]):
    """The project's recipe ``method`` with its default parameters, as a job would carry it."""
    from pdmask.backends.verl.file_recipes import FileRecipe
    from pdmask.registry import load_registry

    reg = load_registry()
    recipe = reg.recipes.get(method)
    if recipe is None:
        known = ", ".join(sorted(reg.recipes))
        problems.append(
            Problem("verl overrides", "method", f"unknown method {method!r}; known: {known}")
        )
        return None
    return FileRecipe.of(recipe, recipe.resolve_params({})[0])


def _check(
    method, delta, nnodes, n_gpus_per_node, precision, mu_source, topk, file_recipe, problems
) -> None:
    def need(ok: bool, field: str, message: str) -> None:
        if not ok:
            problems.append(Problem("verl overrides", field, message))

    if file_recipe is not None:
        need(
            file_recipe.name == method,
            "file_recipe",
            f"carries recipe {file_recipe.name!r}, not {method!r}",
        )
        need(
            not file_recipe.native or file_recipe.role_value("ratio_cap") is None,
            "params.ratio_cap",
            f"verl's own loss {file_recipe.loss_mode!r} has no truncated-IS cap; leave it unset",
        )
    need(precision in PRECISIONS, "precision", f"must be one of {PRECISIONS}, got {precision!r}")
    need(mu_source in MU_SOURCES, "mu_source", f"must be one of {MU_SOURCES}, got {mu_source!r}")
    need(isinstance(topk, int) and topk >= 1, "topk", f"must be an integer >= 1, got {topk!r}")
    need(
        isinstance(nnodes, int) and nnodes >= 1,
        "nnodes",
        f"must be an integer >= 1, got {nnodes!r}",
    )
    need(
        isinstance(n_gpus_per_node, int) and n_gpus_per_node >= 1,
        "n_gpus_per_node",
        f"must be an integer >= 1, got {n_gpus_per_node!r}",
    )
    need(delta is None or delta > 0, "delta", f"must be > 0, got {delta!r}")
    if _uses_delta(method, file_recipe):
        need(delta is not None, "delta", f"{method} needs the trust-region radius delta")
    if problems:
        raise ValidationFailed(problems)


def _uses_delta(method: str, file_recipe) -> bool:
    return file_recipe is not None and file_recipe.uses_delta


def verl_overrides(
    method: str,
    delta: float | None,
    *,
    model_path: str,
    nnodes: int,
    n_gpus_per_node: int,
    precision: str,
    mu_source: str = "rollout",
    topk: int = 20,
    experiment: str,
    run_name: str,
    extra: dict | None = None,
    file_recipe=None,
    engine: str = "fsdp",
) -> list[str]:
    """``key=value`` overrides for verl 0.9.1's ``ppo_trainer`` config running ``method``.

    ``engine``: the actor's engine (``catalog.training_engine``): ``fsdp`` (FSDP2) or
    ``megatron`` (``model_engine=megatron``; its actor keys come in ``extra``: ``megatron_job``).

    ``file_recipe`` (a :class:`~pdmask.backends.verl.file_recipes.FileRecipe`): the trial's
    recipe, which the job carries in its environment (``job_env``); None: the project's recipe
    named ``method`` with its default parameters.
    """
    problems: list[Problem] = []
    if file_recipe is None:
        file_recipe = _project_recipe(method, problems)
    _check(
        method, delta, nnodes, n_gpus_per_node, precision, mu_source, topk, file_recipe, problems
    )
    is_pdmask_loss = not file_recipe.native
    rollout_topk = is_pdmask_loss and mu_source == "rollout"
    o: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        # mu = vLLM's behaviour policy (bypass: old_log_probs := rollout_log_probs), or pi_old.
        "algorithm.rollout_correction.bypass_mode": mu_source == "rollout",
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.use_fused_kernels": False,
        "actor_rollout_ref.model.external_lib": PLUGIN_MODULE,
        # Said, not left to verl's default: the attention every training node must import
        # (node_requirements.py; a CPU profile replaces it with torch's SDPA).
        f"+{ATTENTION_KEY}": FLASH_ATTENTION.implementation,
        **({f"{_A}.strategy": "fsdp2"} if engine == "fsdp" else {"model_engine": engine}),
        f"{_A}.use_kl_loss": False,
        f"{_A}.entropy_coeff": 0,
        f"{_A}.loss_agg_mode": "token-mean",
        f"{_A}.use_dynamic_bsz": True,
        f"{_R}.log_prob_use_dynamic_bsz": True,
        f"{_PL}._target_": POLICY_LOSS_CONFIG,
        f"{_PL}.loss_mode": file_recipe.loss_mode,
        f"+{_PL}.pdm_mu_source": mu_source,
        f"+{_PL}.pdm_topk": topk,
        f"{_R}.name": "vllm",
        f"{_R}.temperature": 1.0,
        f"{_R}.top_p": 1.0,
        f"{_R}.top_k": -1,
        f"{_R}.calculate_log_probs": True,
        f"{_R}.logprobs_mode": "processed_logprobs",
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_NAME,
        "trainer.logger": ["console", "mlflow"],
        "trainer.project_name": experiment,
        "trainer.experiment_name": run_name,
        "trainer.nnodes": nnodes,
        "trainer.n_gpus_per_node": n_gpus_per_node,
    }
    if _uses_delta(method, file_recipe):
        o[f"+{_PL}.pdm_delta"] = delta
    if not is_pdmask_loss:  # the recipe's clip parameters become verl's
        o[f"{_A}.clip_ratio_low"] = file_recipe.role_value("clip_low", 0.2)
        o[f"{_A}.clip_ratio_high"] = file_recipe.role_value("clip_high", 0.28)
        o.update({f"{_A}.{key}": value for key, value in NATIVE_DUAL_CLIP_OFF.items()})
    elif file_recipe.role_value("ratio_cap") is not None:
        o[f"+{_PL}.pdm_ratio_cap"] = float(file_recipe.role_value("ratio_cap"))
    if rollout_topk:
        o[f"+{_R}.custom.pdm_topk"] = topk
        o[f"{_R}.agent.default_agent_loop"] = AGENT_LOOP
        if topk > VLLM_DEFAULT_MAX_LOGPROBS:
            o[f"+{_R}.engine_kwargs.vllm.max_logprobs"] = topk
    numerics = ROLLOUT_NUMERICS[precision]  # what the precision asks of vLLM: one home
    if numerics.weights == "fp8":
        o[f"{_R}.quantization"] = "fp8"
    if numerics.kv_cache != "auto":
        o[f"+{_R}.engine_kwargs.vllm.kv_cache_dtype"] = numerics.kv_cache

    by_name = {key.lstrip("+"): key for key in o}
    for key, value in (extra or {}).items():
        existing = by_name.get(key.lstrip("+"))
        if existing is not None:
            del o[existing]
        o[key] = value
    return [f"{key}={_value(value)}" for key, value in o.items()]


def job_env(
    *,
    tracking_uri: str,
    run_id: str | None = None,
    tags: dict[str, str] | None = None,
    file_recipe=None,
) -> dict[str, str]:
    """Environment variables of a VeRL job (Ray job runtime env: reaches every actor on every node).

    With ``run_id`` verl attaches to that pre-created run; otherwise ``tags`` are applied when verl
    creates the run. ``file_recipe``: the recipe file the job carries (see ``verl_overrides``).
    """
    env = {
        "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
        "MLFLOW_TRACKING_URI": tracking_uri,  # the job's environment only: never printed
        **QUIET_MLFLOW,  # MLflow's "View run" lines would print the URI's password
    }
    if file_recipe is not None:
        env.update(file_recipe.env())
    if run_id:
        env["MLFLOW_RUN_ID"] = run_id
    elif tags:
        env["MLFLOW_RUN_CONTEXT"] = json.dumps({k: str(v) for k, v in tags.items()})
    return env
