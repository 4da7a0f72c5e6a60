"""``actor/entropy`` on verl's real loss path: the logits hook computes H(pi), the loss aggregates it
as verl aggregates its own metrics, for pdmask's losses and verl's own alike, against a float64
entropy of the same logits."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.metric import AggregationType, Metric  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from pdmask.backends.verl.loss import pdm_ppo_loss  # noqa: E402
from pdmask.backends.verl.metrics import ENTROPY_METRIC, keep_first_update  # noqa: E402
from pdmask.backends.verl.processor import ENTROPY_KEY  # noqa: E402

from .batches import engine_forward, make_batch, micro_batch  # noqa: E402
from .test_loss_path import ALL, actor_config, verl_step  # noqa: E402


def float64_entropy(batch, indices) -> list[torch.Tensor]:
    """Per sample, H(pi) at each response token, in float64 from the same logits."""
    out = []
    for i in indices:
        sample = batch.samples[i]
        p = len(sample.prompt)
        rows = sample.logits[p - 1 : p - 1 + len(sample.response)].double()
        logp = torch.log_softmax(rows, -1)
        out.append(-(logp.exp() * logp).sum(-1))
    return out


def reference(batch, indices, agg_mode: str) -> float:
    per_sample = float64_entropy(batch, indices)
    if agg_mode == "token-mean":
        return float(torch.cat(per_sample).mean())
    assert agg_mode == "seq-mean-token-mean"
    return float(torch.stack([h.mean() for h in per_sample]).mean())


def value(metric) -> float:
    return float(metric.aggregate() if isinstance(metric, Metric) else metric)


@pytest.mark.parametrize(
    "method,agg_mode",
    [
        ("pdm-agg", "token-mean"),  # no recipe input: the entropy is a value only
        ("pdm-uni", "seq-mean-token-mean"),
        ("ent-bonus", "token-mean"),  # the recipe differentiates it: the same value
    ],
)
def test_pdmask_losses_log_the_policys_entropy(method, agg_mode, carry):
    batch = make_batch(dtype=torch.float32)
    job = carry(method, delta=0.05)
    _, metrics = verl_step(batch, ALL, actor_config(job.loss_mode, agg_mode))
    expected = reference(batch, ALL, agg_mode)
    # float32 sums over 64 columns of an O(log 64) quantity: a few ulps of 4 (float32 eps 1.2e-7)
    assert value(metrics[ENTROPY_METRIC]) == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert 0.5 < expected < torch.log(torch.tensor(batch.vocab)).item()  # not degenerate


def test_the_hooks_entropy_carries_no_gradient_unless_a_recipe_needs_it(carry):
    batch = make_batch()
    data = micro_batch(batch, ALL)
    for method, differentiable in (("pdm-agg", False), ("ent-bonus", True)):
        config = actor_config(carry(method, delta=0.05).loss_mode)
        loss_fn = partial(pdm_ppo_loss, config=config)
        model_output = engine_forward(batch.sample_logits(ALL), data, loss_fn)
        assert model_output[ENTROPY_KEY].requires_grad == differentiable, method


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_verls_own_loss_is_unchanged_and_gains_the_entropy(agg_mode):
    """grpo-clip-higher is verl's vanilla: with pdmask's loss function installed its loss and
    gradient are verl's own, and the hook adds H(pi) alone."""
    batch = make_batch(mismatch=0.6)
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg_mode
    )
    ours, metrics = verl_step(batch, ALL, config)
    our_grad = batch.leaf.grad.clone()
    batch.leaf.grad = None

    data = micro_batch(batch, ALL, distillation_use_topk=False)  # verl's actor, as upstream
    model_output = engine_forward(batch.sample_logits(ALL), data, None)
    loss, upstream = ppo_loss(config, model_output, data)
    loss.backward()
    torch.testing.assert_close(ours, loss)
    torch.testing.assert_close(our_grad, batch.leaf.grad)
    assert ENTROPY_METRIC not in upstream and set(upstream) <= set(metrics)
    assert value(metrics[ENTROPY_METRIC]) == pytest.approx(
        reference(batch, ALL, agg_mode), rel=1e-6, abs=1e-6
    )


@pytest.mark.parametrize("method", ["pdm-agg", None])
@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_combine_into_the_mini_batchs_entropy(method, agg_mode, carry):
    """As verl combines a mini-batch's micro-batches (and DP ranks): their SUM-aggregated shares
    are the whole mini-batch's entropy, whatever the split."""
    batch = make_batch()
    if method is None:  # verl's own loss
        config = ActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg_mode
        )
    else:
        config = actor_config(carry(method, delta=0.05).loss_mode, agg_mode)
    n_tokens = sum(len(s.response) for s in batch.samples)
    info = {"batch_num_tokens": n_tokens, "global_batch_size": len(ALL), "dp_size": 1}
    merged = Metric(AggregationType.SUM)
    for indices in ([0, 2], [3], [1]):
        _, metrics = verl_step(batch, indices, config, **info)
        assert metrics[ENTROPY_METRIC].aggregation == AggregationType.SUM
        merged.append(metrics[ENTROPY_METRIC])
    assert Metric.aggregate_dp([merged]) == pytest.approx(
        reference(batch, ALL, agg_mode), rel=1e-6, abs=1e-6
    )


def test_a_step_keeps_its_first_mini_batchs_entropy():
    """verl's train_mini_batch returns a list per key, one value per mini-batch; the step's
    actor/entropy is the first (taken at the parameters the step started from)."""
    metrics = {ENTROPY_METRIC: [2.5, 2.4, 2.3], "actor/pg_loss": [0.1, 0.2, 0.3]}
    output = tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics}).cpu()
    keep_first_update(tu.get(output, "metrics"))
    assert tu.get(output, "metrics") == {
        ENTROPY_METRIC: [2.5],
        "actor/pg_loss": [0.1, 0.2, 0.3],
    }
    keep_first_update(empty := {"actor/pg_loss": [0.1]})  # a loss that logged none
    assert empty == {"actor/pg_loss": [0.1]}


class _ActorGroup:
    """The actor worker group's ``update_actor``, as its ranks return it (verl's layout)."""

    def __init__(self, entropy: list[float]):
        self.entropy = entropy

    def update_actor(self, batch):
        metrics = {ENTROPY_METRIC: self.entropy, "actor/pg_loss": [0.5], "mfu": [0.1]}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


@pytest.mark.parametrize("verl_computed", [None, 3.25])
def test_the_trainer_keeps_verls_own_entropy_where_verl_computed_one(verl_computed):
    """Bypass mode: pdmask's value; mu recomputed: verl's old-log-prob pass logged the exact one
    over the whole batch before the update, and it stays."""
    from pdmask.backends.verl.trainer import PDMTrainerSync

    trainer = PDMTrainerSync.__new__(PDMTrainerSync)  # only what verl's _update_actor reads
    trainer.config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {
                    "ppo_mini_batch_size": 4,
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                    "ppo_epochs": 1,
                    "data_loader_seed": 0,
                    "shuffle": False,
                },
                "rollout": {"n": 2, "temperature": 1.0},
            }
        }
    )
    trainer.actor_rollout_wg = _ActorGroup([2.0])
    metrics = {} if verl_computed is None else {ENTROPY_METRIC: verl_computed}
    trainer._update_actor(SimpleNamespace(extra_info={}), metrics)
    assert metrics[ENTROPY_METRIC] == (2.0 if verl_computed is None else verl_computed)
    assert metrics["actor/pg_loss"] == 0.5  # verl's own reduction ran


@pytest.mark.parametrize(
    "pad_to_length,fused,allowed",
    [(False, False, True), (True, False, False), (False, True, False)],
)
def test_verls_own_loss_gets_the_hook_only_where_verls_engine_allows_it(
    pad_to_length, fused, allowed
):
    """A job of verl's own loss may set static padding (verl's engine then refuses the hook) or
    fused kernels (no logits): its actor then runs without the hook, and logs no entropy, rather
    than failing."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from pdmask.backends.verl.worker import PDMActorRolloutRefWorker

    worker = PDMActorRolloutRefWorker.__new__(PDMActorRolloutRefWorker)
    worker.config = OmegaConf.create(
        {"actor": {"pad_to_length": pad_to_length}, "model": {"use_fused_kernels": fused}}
    )
    assert worker._hook_allowed() == allowed
    if pad_to_length:  # what the predicate spares such a job
        engine = object.__new__(FSDPEngineWithLMHead)
        engine.pad_to_length = True
        with pytest.raises(RuntimeError, match="pad_to_length"):
            engine.prepare_model_inputs(micro_batch(make_batch(), ALL))
