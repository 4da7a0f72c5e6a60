"""pdmask's losses through verl's own loss path (``ppo_loss`` on nested TensorDicts) equal the math API.

Each method is the recipe its job carries (``recipe_env.carry``), as on every worker of a job.
"""

from __future__ import annotations

from functools import partial

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import torch  # noqa: E402
from verl.utils.metric import AggregationType, Metric  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from pdmask.backends.verl.config import PDMPolicyLossConfig  # noqa: E402
from pdmask.backends.verl.loss import pdm_ppo_loss  # noqa: E402
from pdmask.backends.verl.overrides import NATIVE_DUAL_CLIP_OFF  # noqa: E402
from pdmask.trust_region import Method, policy_loss  # noqa: E402
from tests.methods import method as recipe_method  # noqa: E402
from tests.methods import project_recipes  # noqa: E402

from .batches import engine_forward, make_batch, micro_batch, response_frame  # noqa: E402

ALL = [0, 1, 2, 3]
DELTA = 0.05


def actor_config(
    loss_mode: str, agg_mode: str = "token-mean", delta: float | None = DELTA, **pdm
) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=agg_mode,
        policy_loss=PDMPolicyLossConfig(
            loss_mode=loss_mode, pdm_delta=delta, pdm_topk=5, pdm_chunk_size=7, **pdm
        ),
    )


def verl_step(batch, indices, config, **non_tensor):
    """One micro-batch the way the FSDP actor runs it: hook, loss, backward."""
    data = micro_batch(batch, indices, **non_tensor)
    loss_fn = partial(pdm_ppo_loss, config=config)
    model_output = engine_forward(batch.sample_logits(indices), data, loss_fn)
    loss, metrics = loss_fn(model_output=model_output, data=data)
    loss.backward()
    return loss, metrics


def math_api_step(batch, method, agg_mode="token-mean", delta=DELTA, **params):
    """The math API's ``policy_loss`` on the same samples; ``method`` a recipe name (with its
    ``params``, delta included) or a ``Method``."""
    if not isinstance(method, Method):
        method = recipe_method(method, delta=delta, **params)
    frame = response_frame(batch, ALL)
    result = policy_loss(
        method,
        frame.logits,
        frame.sampled,
        frame.ids,
        frame.lps,
        frame.mu_k,
        frame.adv,
        frame.valid,
        delta=delta,
        loss_agg_mode=agg_mode,
    )
    result.loss.backward()
    return result


@pytest.mark.parametrize(
    "method,agg_mode,delta",
    [
        ("pdm-agg", "token-mean", DELTA),
        ("pdm-uni", "seq-mean-token-mean", DELTA),
        ("dppo-topk-kl", "token-mean", DELTA),
        ("dppo-topk-tv", "seq-mean-token-sum", DELTA),
        ("dppo-binary-kl", "token-mean", 0.002),
        ("pdm-tv", "token-mean", DELTA),
        # issue 24's probe methods: a loss that sees its mask, two thresholds, a sequence region
        ("k3-penalty", "token-mean", DELTA),
        ("asym-pdm", "token-mean", DELTA),
        ("seq-tv", "seq-mean-token-mean", DELTA),
        ("ent-bonus", "token-mean", DELTA),  # its entropy's gradient flows through the hook
    ],
)
def test_loss_and_gradient_equal_math_api(method, agg_mode, delta, carry):
    batch = make_batch()
    job = carry(method, delta=delta)
    loss, metrics = verl_step(batch, ALL, actor_config(job.loss_mode, agg_mode, delta))
    verl_grad = batch.leaf.grad.clone()
    batch.leaf.grad = None
    ref = math_api_step(batch, method, agg_mode, delta)
    torch.testing.assert_close(loss, ref.loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(verl_grad, batch.leaf.grad, rtol=1e-5, atol=1e-7)
    # non-vacuous: the method masks some tokens but not all, and the diagnostics agree
    masked = ref.metrics["masked_frac"]
    assert 0 < masked < 1, masked
    assert metrics["actor/pdm/masked_frac"].aggregate() == pytest.approx(masked)
    assert metrics["actor/pg_clipfrac"].aggregate() == pytest.approx(masked)
    # verl reduces any key containing "max"/"min" with max/min over mini-batches
    pdm_keys = [key for key in metrics if key.startswith("actor/pdm/")]
    assert len(pdm_keys) > 10 and not any("max" in key or "min" in key for key in pdm_keys)
    assert metrics["actor/pdm/kl_topk_mean"].aggregate() == pytest.approx(
        ref.metrics["kl_topk_mean"], rel=1e-5
    )


REPORTING = '''"""A test recipe that reports a scalar of its own."""
from pdmask.registry import Recipe


def masked_where_kl_is_high(batch):
    kl = batch.stats.kl_topk
    mask = (kl > kl[batch.response_mask].median()) & batch.response_mask
    batch.report("outside_share", mask[batch.response_mask].float().mean())
    return mask


RECIPE = Recipe(
    name="reporting", display_name="r", color="#123456", summary="s",
    mask=masked_where_kl_is_high,
)
'''


def test_a_recipes_own_scalar_reaches_verls_metrics(carried):
    """RecipeBatch.report on verl's loss path: actor/pdm/recipe/<name>, next to the masked share
    verl reports for the same micro-batch."""
    from pdmask.backends.verl.file_recipes import ENV_VAR, FileRecipe
    from pdmask.registry.recipe_files import recipe_from_source
    from pdmask.trust_region import RECIPE_METRIC_PREFIX

    entry = FileRecipe.of(recipe_from_source("recipes/reporting.py", REPORTING), {}, "bf16")
    carried(entry.env()[ENV_VAR])
    _, metrics = verl_step(make_batch(), ALL, actor_config(entry.loss_mode, delta=None))

    def value(metric):
        return metric.aggregate() if isinstance(metric, Metric) else metric

    share = value(metrics[RECIPE_METRIC_PREFIX + "outside_share"])
    clipfrac = value(metrics["actor/pg_clipfrac"])
    assert share == pytest.approx(clipfrac, rel=1e-6) and 0.3 < share < 0.7, metrics


SUPPORT_KL = '''"""A test recipe whose loss differentiates an exact top-K KL over the support."""
from pdmask.registry import Recipe


def kl_penalty_loss(batch):
    sup = batch.support
    kl = (sup.mu_log_prob.exp() * (sup.mu_log_prob - sup.log_prob)).where(sup.valid, 0.0).sum(-1)
    kl = kl + sup.mu_tail_mass * (sup.mu_tail_mass.log() - sup.tail_mass.log())
    return -batch.ratio * batch.advantages + 0.5 * kl


RECIPE = Recipe(
    name="support-kl", display_name="s", color="#123456", summary="s",
    loss=kl_penalty_loss, needs=("behaviour_topk", "support_log_probs"),
)
'''


def test_the_support_log_probs_and_their_gradient_reach_verls_loss(carried):
    """``needs: support_log_probs`` on verl: the hook's support view, slot by slot through the
    engine's outputs, gives the loss and gradient of the math API (where it is one tensor)."""
    from pdmask.backends.verl.file_recipes import ENV_VAR, FileRecipe
    from pdmask.registry.recipe_files import recipe_from_source

    recipe = recipe_from_source("recipes/support_kl.py", SUPPORT_KL)
    entry = FileRecipe.of(recipe, {}, "bf16")
    carried(entry.env()[ENV_VAR])
    batch = make_batch(mismatch=0.6)
    loss, _ = verl_step(batch, ALL, actor_config(entry.loss_mode, delta=None))
    verl_grad = batch.leaf.grad.clone()
    batch.leaf.grad = None
    ref = math_api_step(batch, recipe.method(recipe.resolve_params({})[0]), delta=None)
    torch.testing.assert_close(loss, ref.loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(verl_grad, batch.leaf.grad, rtol=1e-5, atol=1e-7)
    # non-vacuous: the penalty's own gradient is there (the policy-gradient term alone differs)
    batch.leaf.grad = None
    math_api_step(batch, Method("pg-only"), delta=None)
    assert not torch.allclose(verl_grad, batch.leaf.grad, rtol=1e-3, atol=1e-6)


def test_ratio_cap_reaches_the_loss(carry):
    batch = make_batch()
    job = carry("pdm-agg")  # carried without a cap: the job's own knob sets it
    verl_step(batch, ALL, actor_config(job.loss_mode, pdm_ratio_cap=1.1))
    capped = batch.leaf.grad.clone()
    batch.leaf.grad = None
    math_api_step(batch, "pdm-agg", ratio_cap=1.1)
    torch.testing.assert_close(capped, batch.leaf.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_split_gives_the_whole_batch_gradient(agg_mode, carry):
    batch = make_batch()
    config = actor_config(carry("pdm-agg").loss_mode, agg_mode)
    n_tokens = sum(len(s.response) for s in batch.samples)
    info = {"batch_num_tokens": n_tokens, "global_batch_size": len(ALL), "dp_size": 1}
    whole_loss, whole_metrics = verl_step(batch, ALL, config, **info)
    whole_grad = batch.leaf.grad.clone()
    batch.leaf.grad = None
    split_losses, split_metrics = [], []
    for indices in ([0, 2], [3], [1]):
        loss, metrics = verl_step(batch, indices, config, **info)
        split_losses.append(loss.detach())
        split_metrics.append(metrics)
    torch.testing.assert_close(batch.leaf.grad, whole_grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(sum(split_losses), whole_loss.detach(), rtol=1e-5, atol=1e-7)
    # token-mean diagnostics are SUM-aggregated partial means: exact over the split too
    for key in ("actor/pdm/masked_frac", "actor/pdm/kl_topk_mean", "actor/pdm/disagree_agg"):
        assert whole_metrics[key].aggregation == AggregationType.SUM
        merged = Metric(AggregationType.SUM)
        for m in split_metrics:
            merged.append(m[key])
        assert Metric.aggregate_dp([merged]) == pytest.approx(
            whole_metrics[key].aggregate(), rel=1e-6
        )


def test_grpo_clip_higher_is_verl_vanilla_by_config_only():
    """verl's vanilla loss with the generated clip settings has the math API's gradient."""
    recipe = project_recipes()["grpo-clip-higher"]
    assert recipe.verl_name == "vanilla"
    defaults = recipe.resolve_params({})[0]
    batch = make_batch(mismatch=0.6)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=recipe.role_value("clip_low", defaults),
        clip_ratio_high=recipe.role_value("clip_high", defaults),
        clip_ratio_c=NATIVE_DUAL_CLIP_OFF["clip_ratio_c"],
    )
    data = micro_batch(batch, ALL, distillation_use_topk=False)
    loss_fn = partial(ppo_loss, config=config)
    model_output = engine_forward(batch.sample_logits(ALL), data, None)
    loss, metrics = loss_fn(model_output=model_output, data=data)
    loss.backward()
    verl_grad = batch.leaf.grad.clone()
    batch.leaf.grad = None
    ref = math_api_step(batch, "grpo-clip-higher")
    assert 0 < ref.metrics["masked_frac"] < 1
    torch.testing.assert_close(verl_grad, batch.leaf.grad, rtol=1e-5, atol=1e-7)


def test_registered_loss_refuses_to_run_without_the_statistics(carry):
    batch = make_batch()
    config = actor_config(carry("pdm-agg").loss_mode)
    data = micro_batch(batch, ALL, distillation_use_topk=False)
    model_output = engine_forward(batch.sample_logits(ALL), data, None)
    with pytest.raises(RuntimeError, match="distillation_use_topk"):
        pdm_ppo_loss(config, model_output=model_output, data=data)
    with pytest.raises(RuntimeError, match="pdm_sync"):
        ppo_loss(config, model_output, data)  # verl's path straight into the registered loss
