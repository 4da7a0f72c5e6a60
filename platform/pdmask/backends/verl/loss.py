"""pdmask's methods as verl policy losses, computed with the math API only.

verl's registered policy losses see only padded ``(old_log_prob, log_prob, advantages,
response_mask)``; pdmask's masks need per-token statistics computed from the full logits. So the
actor runs :func:`pdm_ppo_loss` instead of verl's ``ppo_loss`` (the worker installs it), in two
modes that verl's FSDP engine calls in turn for every micro-batch:

1. as the logits hook (``student_logits=...``): the per-token statistics (``processor``);
2. as the loss (``model_output=..., data=...``): the statistics are brought into the padded
   response frame and verl's own ``ppo_loss`` runs unchanged (entropy, KL loss,
   ``global_batch_info`` and metric aggregation stay upstream's). Its call of the registered loss
   (the job's recipe's name: ``pdm_agg``, ``dppo_topk_kl``, ...) finds the statistics and the
   recipe's method in a context variable and runs the math API's ``apply_method`` -- the recipe's
   mask and per-token loss on the recipe contract, with verl's differentiable ``log_prob`` -- then
   aggregates with verl's ``agg_loss``.

A recipe that is one of verl's own losses (``grpo-clip-higher`` is ``vanilla``) goes through
``ppo_loss`` untouched; its hook computes the policy's entropy only. Either way the loss adds
``actor/entropy`` to verl's metrics (``metrics.add_entropy_metric``).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import torch
from verl.trainer.ppo.core_algos import agg_loss
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from pdmask.backends.verl import compat
from pdmask.backends.verl.config import DEFAULT_TOPK
from pdmask.backends.verl.file_recipes import FileRecipe, pdmask_losses
from pdmask.backends.verl.metrics import add_entropy_metric, diagnostic_metrics
from pdmask.backends.verl.processor import (
    ENTROPY_KEY,
    OLD_PHASE,
    STAT_KEY,
    StatsSettings,
    entropy_outputs,
    old_policy_topk_outputs,
    phase,
    statistics_outputs,
    stats_from_outputs,
)
from pdmask.errors import ConfigError
from pdmask.registry.backends import VERL
from pdmask.trust_region import RECIPE_METRIC_PREFIX, Method, TokenStats, apply_method

compat.require(["plugin", "loss"])


@dataclass(frozen=True)
class LossSettings:
    """The pdmask knobs of an actor config whose ``loss_mode`` is the job's recipe's."""

    recipe: FileRecipe
    loss_mode: str
    delta: float | None
    topk: int
    ratio_cap: float | None
    chunk_size: int | None
    support: str

    @classmethod
    def from_actor_config(cls, config) -> LossSettings | None:
        """None when the configured loss is not pdmask's (e.g. ``vanilla``)."""
        policy_loss = config.policy_loss
        loss_mode = policy_loss.get("loss_mode", "vanilla")
        recipe = pdmask_losses().get(loss_mode)
        if recipe is None:
            return None
        delta = policy_loss.get("pdm_delta", None)
        if recipe.uses_delta and delta is None:
            raise ConfigError(
                f"actor_rollout_ref.actor.policy_loss.pdm_delta: required by {recipe.name} (set "
                "policy_loss._target_=pdmask.backends.verl.config.PDMPolicyLossConfig and "
                "+actor_rollout_ref.actor.policy_loss.pdm_delta=<delta>)"
            )
        return cls(
            recipe=recipe,
            loss_mode=loss_mode,
            delta=delta,
            topk=policy_loss.get("pdm_topk", DEFAULT_TOPK),
            ratio_cap=policy_loss.get("pdm_ratio_cap", None),
            chunk_size=policy_loss.get("pdm_chunk_size", None),
            support=policy_loss.get("pdm_support", "union"),
        )

    def method(self) -> Method:
        """The recipe's mask and loss, its role parameters set from the job's knobs."""
        roles = {"delta": self.delta, "topk": self.topk, "ratio_cap": self.ratio_cap}
        return self.recipe.method(roles)

    def stats_settings(self) -> StatsSettings:
        needs = tuple(self.recipe.recipe().needs)
        return StatsSettings(self.recipe.name, self.topk, self.chunk_size, self.support, needs)


@dataclass
class _ActiveBatch:
    """What the registered loss needs from the wrapper for the micro-batch being computed."""

    loss_mode: str
    method: Method
    stats: TokenStats  # (B, R) each, in the loss's padded response frame
    precision: str | None
    mask: torch.Tensor | None = None  # (B, R) bool, set by the registered loss


_ACTIVE_BATCH: contextvars.ContextVar[_ActiveBatch | None] = contextvars.ContextVar(
    "pdmask_active_batch", default=None
)


def pdm_ppo_loss(
    config, model_output=None, data=None, dp_group=None, *, student_logits=None, data_format=None
):
    """The actor's loss function (install with ``partial(pdm_ppo_loss, config=actor_config)``).
    ``data_format``: only verl's Megatron engine passes it (``megatron_processor``)."""
    settings = LossSettings.from_actor_config(config)
    old_phase = phase(data) == OLD_PHASE
    if student_logits is not None:  # called as the logits hook
        if settings is None:  # verl's own loss: the policy's entropy is all pdmask adds
            if data_format is not None:  # a vocabulary shard alone has no entropy
                return {}
            return entropy_outputs(student_logits, data)
        if data_format is not None:  # vocabulary-parallel logits in Megatron's layout
            return _megatron_hook(config, student_logits, data, settings, data_format, old_phase)
        if old_phase:
            return old_policy_topk_outputs(student_logits, data, settings.topk, settings.chunk_size)
        return statistics_outputs(student_logits, data, settings.stats_settings())
    if old_phase:  # the old-policy pass only wanted the hook's outputs
        return torch.zeros(()), {}
    if settings is None:
        loss, metrics = ppo_loss(config, model_output, data, dp_group)
        if ENTROPY_KEY in model_output:  # absent where the engine did not call the hook
            entropy = no_padding_2_padding(model_output[ENTROPY_KEY], data)
            mask = data.select("response_mask").to_padded_tensor()["response_mask"]
            add_entropy_metric(metrics, entropy, mask, config)
        return loss, metrics

    stat_keys = [key for key in model_output if key.startswith(STAT_KEY.format(""))]
    if not stat_keys:
        raise RuntimeError(
            "the actor's forward produced no pdmask statistics: the micro-batch must carry "
            "distillation_use_topk=True (pdmask's worker sets it; trainer.v1.trainer_mode=pdm_sync)"
        )
    stats = stats_from_outputs(
        {key: no_padding_2_padding(model_output[key], data) for key in stat_keys}
    )
    padded = data.select("response_mask", "advantages").to_padded_tensor()
    valid = padded["response_mask"].bool()
    advantages = padded["advantages"].to(stats.ratio.dtype)

    active = _ActiveBatch(settings.loss_mode, settings.method(), stats, settings.recipe.precision)
    token = _ACTIVE_BATCH.set(active)
    try:
        loss, metrics = ppo_loss(config, model_output, data, dp_group)
    finally:
        _ACTIVE_BATCH.reset(token)
    metrics.update(
        diagnostic_metrics(
            stats,
            advantages,
            active.mask,
            valid,
            delta=settings.delta,
            batch_num_tokens=tu.get_non_tensor_data(data, "batch_num_tokens", None),
            dp_size=tu.get_non_tensor_data(data, "dp_size", 1),
        )
    )
    add_entropy_metric(metrics, stats.entropy, valid, config)
    return loss, metrics


def _megatron_hook(config, student_logits, data, settings, data_format, old_phase):
    from megatron.core import parallel_state as mpu

    from pdmask.backends.verl.megatron_processor import (
        megatron_statistics_outputs,
        refuse_unsupported,
    )

    refuse_unsupported(mpu.get_context_parallel_world_size(), old_phase)
    # verl's forward pads for FP8 where the transformer trains in FP8 (model_forward.py)
    fp8 = config.megatron.override_transformer_config.get("fp8") in ("e4m3", "hybrid")
    return megatron_statistics_outputs(
        student_logits, data, settings.stats_settings(), data_format=data_format, fp8_padding=fp8
    )


def masked_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    loss_mode: str,
):
    """The registered verl policy loss of a pdmask method: the recipe's mask and per-token loss
    (``apply_method``, the one call every backend makes) through verl's ``agg_loss``."""
    batch = _ACTIVE_BATCH.get()
    if batch is None or batch.loss_mode != loss_mode:
        raise RuntimeError(
            f"policy loss {loss_mode!r} needs the per-token top-K statistics of pdmask's actor loss "
            "function; run the job with trainer.v1.trainer_mode=pdm_sync so the actor installs it"
        )
    out = apply_method(
        batch.method,
        batch.stats,
        advantages,
        response_mask,
        log_prob=log_prob,
        mu_log_prob=old_log_prob,
        backend=VERL.name,
        precision=batch.precision,
    )
    mask = batch.mask = out.mask
    token_loss = out.token_loss
    if rollout_is_weights is not None:
        token_loss = token_loss * rollout_is_weights
    loss = agg_loss(token_loss, response_mask, loss_agg_mode, **config.global_batch_info)
    valid = response_mask.bool()
    n_valid = valid.sum().clamp_min(1)
    clipfrac, ppo_kl = torch.stack(  # one read back to the host for both
        [
            (mask & valid).sum() / n_valid,
            torch.where(valid, old_log_prob - log_prob, 0.0).sum() / n_valid,
        ]
    ).tolist()
    metrics = {
        # verl's names, so its dashboards show the masked share and the mismatch as for any loss.
        "actor/pg_clipfrac": clipfrac,
        "actor/ppo_kl": ppo_kl,
        # The recipe's own scalars (RecipeBatch.report), averaged over micro-batches by verl.
        **{RECIPE_METRIC_PREFIX + k: v for k, v in out.batch.reported.items()},
    }
    return loss, metrics


# The plugin registers the losses (calling masked_policy_loss); importing it here makes sure they
# are registered even where verl's plugin discovery is off (VERL_USE_EXTERNAL_PLUGINS=none).
from pdmask.backends.verl import plugin  # noqa: E402,F401
