"""``train_trial``: one GRPO trial of a stand-in, as VeRL runs one, on one CPU core.

Each step: the behaviour copy samples ``prompts x G`` responses and records its top-K view; the
trainer splits the batch into ``minibatches`` and makes one AdamW update per minibatch (all but the
first are stale, as in VeRL with ``ppo_mini_batch_size < train_batch_size``), each with the
recipe's mask and the masked loss from the math API; then the trainer's weights are synced into
the behaviour copy in the setting's precision.

Metrics are the means over the step's minibatches, plus ``actor/pdm/mismatch_kl_*`` (first
minibatch: precision mismatch only) and ``actor/pdm/stale_kl_topk`` (last minibatch: mismatch plus
policy lag). ``actor/pdm/kl_full_mean`` and ``sign_match_*`` use the full behaviour distribution,
which only a simulator has. ``actor/entropy`` has verl's name and meaning: the mean token entropy
of the policy being trained, as it is before the step's updates, over response tokens, aggregated
with ``loss_agg_mode`` (verl computes it in its old-log-prob pass over the whole batch; here it is
measured on the first minibatch, a random quarter of the batch that the trainer meets at exactly
those parameters). ``actor/pdm/ratio_p01|p50|p99`` are quantiles of ``r = pi / mu`` over every
response token the step's loss saw (mismatch and policy lag together). ``response_length/*``
describe the rollout's response lengths (the task's attempts make them vary: mean, median, 90th
percentile, max, min and the share cut at the cap).

With ``lr = 0`` (the mismatch control, ``SimKnobs.lr``) the parameters cannot move, so no backward
pass or optimizer step is taken (and no ``actor/grad_norm`` is logged); everything else is
measured exactly as in a trained trial.

Every random draw of step ``s`` comes from generators seeded by ``(seed, s)``, so a trial resumed
from a checkpoint continues exactly as if it had never stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from pdmask.backends.sim.config import SimTrialConfig
from pdmask.backends.sim.evaluation import EVAL_METRIC, evaluate_avg_at_k
from pdmask.backends.sim.grpo import (
    RolloutBatch,
    exact_reference,
    framed,
    token_stats,
    trainer_logits_and_hidden,
)
from pdmask.backends.sim.precision import sync_behaviour
from pdmask.backends.sim.runtime import single_threaded
from pdmask.backends.sim.state import TrialState, step_generator
from pdmask.backends.sim.task import EOS
from pdmask.errors import TrialFailed
from pdmask.registry.backends import SIM
from pdmask.trust_region import (
    RECIPE_METRIC_PREFIX,
    Method,
    aggregate_loss,
    apply_method,
    diagnostics,
)

MaskFn = Method  # the recipe's mask and per-token loss, parameters bound (Recipe.method)
Reporter = Callable[[int, dict[str, float]], None]
SIGN_MATCH = {"agg": "ddot_agg", "uni": "ddot_uni", "bucket": "ddot_bucket"}


def evaluate(state: TrialState, step: int) -> float:
    budget = state.cfg.resolved()
    return evaluate_avg_at_k(
        state.behaviour,
        state.cfg.task_spec,
        problems=budget.eval_problems,
        samples=state.cfg.eval_samples,
        generator=step_generator(state.cfg.seed, step, "eval"),
    )


RATIO_QUANTILES = {"p01": 0.01, "p50": 0.5, "p99": 0.99}


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``[..., V] -> [...]``: entropy of each position's distribution (nats), no gradient."""
    logp = torch.log_softmax(logits.detach().float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _update(
    state: TrialState, batch: RolloutBatch, index: torch.Tensor, mask_fn: MaskFn, step: int
) -> tuple[dict[str, float], torch.Tensor]:
    """One minibatch update; returns its metrics and the ratios of its response tokens."""
    cfg = state.cfg
    valid = batch.valid[index]
    advantages = batch.token_advantages[index]
    with torch.set_grad_enabled(cfg.learns):  # the lr = 0 control needs no autograd graph
        logits, hidden = trainer_logits_and_hidden(state.trainer, batch, index)
    lm_head = state.trainer.lm_head.weight
    stats = token_stats(logits, batch, index, mask_fn.needs, hidden=hidden, lm_head=lm_head)
    step_out = apply_method(
        mask_fn, stats, advantages, valid, backend=SIM.name, precision=cfg.precision
    )
    mask = step_out.mask
    loss = aggregate_loss(step_out.token_loss, valid, cfg.loss_agg_mode)
    if not torch.isfinite(loss.detach()):
        raise TrialFailed(f"non-finite policy loss ({loss.item()}) at step {step}")
    metrics: dict[str, float] = {}
    if cfg.learns:
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(state.trainer.parameters(), cfg.grad_clip)
        if torch.isfinite(grad_norm):  # as VeRL: a non-finite gradient skips the update
            state.optimizer.step()
        metrics["actor/grad_norm"] = float(grad_norm)

    metrics |= {
        f"actor/pdm/{k}": v
        for k, v in diagnostics(stats, advantages, mask, valid, delta=cfg.delta).items()
    }
    exact = exact_reference(logits, batch, index)
    for name, field in SIGN_MATCH.items():
        agree = torch.sign(getattr(stats, field)) == torch.sign(exact.ddot)
        metrics[f"actor/pdm/sign_match_{name}"] = float(agree[valid].float().mean())
    metrics["actor/pdm/kl_full_mean"] = float(exact.kl[valid].mean())
    metrics["actor/pg_loss"] = float(loss.detach())
    metrics |= {RECIPE_METRIC_PREFIX + k: v for k, v in step_out.batch.reported.items()}
    entropy = aggregate_loss(framed(token_entropy(logits[valid]), valid), valid, cfg.loss_agg_mode)
    metrics["actor/pdm/entropy_minibatch"] = float(entropy)
    return metrics, stats.ratio.detach()[valid]


def response_length_metrics(batch: RolloutBatch) -> dict[str, float]:
    """The rollout's response lengths (tokens, ``<eos>`` included): verl's ``response_length/``
    mean, max, min and ``clip_ratio`` (the share cut at the length cap, without ``<eos>``), and
    the median and 90th percentile of their distribution."""
    lengths = batch.valid.sum(1).double()
    ended = (batch.generation.responses == EOS).any(1)
    return {
        "response_length/mean": float(lengths.mean()),
        "response_length/p50": float(torch.quantile(lengths, 0.5)),
        "response_length/p90": float(torch.quantile(lengths, 0.9)),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": float((~ended).double().mean()),
    }


def rl_step(state: TrialState, mask_fn: MaskFn, step: int) -> dict[str, float]:
    """Rollout, ``minibatches`` updates, weight sync. Returns the step's metrics."""
    cfg, budget = state.cfg, state.cfg.resolved()
    started = time.perf_counter()
    generator = step_generator(cfg.seed, step, "rollout")
    state.trainer.train()
    batch = state.rollout(generator)
    order = torch.randperm(batch.size, generator=generator)
    updates = [
        _update(state, batch, index, mask_fn, step) for index in order.chunk(budget.minibatches)
    ]
    per_update = [m for m, _ in updates]
    sync_behaviour(state.trainer, state.behaviour, cfg.precision, cfg.fp8_scaling)
    # Each key over the minibatches that have it (a recipe may report a scalar on some only).
    keys = dict.fromkeys(k for m in per_update for k in m)
    metrics = {
        k: sum(m[k] for m in per_update if k in m) / sum(k in m for m in per_update) for k in keys
    }
    # The first minibatch is scored at the parameters the step started from (verl's old policy).
    metrics["actor/entropy"] = per_update[0]["actor/pdm/entropy_minibatch"]
    ratios = torch.cat([r for _, r in updates]).double()
    for name, q in RATIO_QUANTILES.items():
        metrics[f"actor/pdm/ratio_{name}"] = float(torch.quantile(ratios, q))
    # The first minibatch meets the trainer exactly as it was synced: its divergence is the
    # precision mismatch alone. The last one adds the policy lag of the stale updates.
    metrics["actor/pdm/mismatch_kl_topk"] = per_update[0]["actor/pdm/kl_topk_mean"]
    metrics["actor/pdm/mismatch_kl_full"] = per_update[0]["actor/pdm/kl_full_mean"]
    metrics["actor/pdm/stale_kl_topk"] = per_update[-1]["actor/pdm/kl_topk_mean"]
    metrics["critic/score/mean"] = float(batch.rewards.mean())
    metrics |= response_length_metrics(batch)
    metrics["perf/total_num_tokens"] = float(batch.num_tokens)
    metrics["perf/tokens_per_s"] = batch.num_tokens / (time.perf_counter() - started)
    return metrics


def train_trial(
    cfg: SimTrialConfig,
    *,
    mask_fn: MaskFn,
    reporter: Reporter,
    workdir: Path,
    should_stop: Callable[[], bool] = lambda: False,
    note: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Run (or resume) one trial; see the package docstring for the contract."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with single_threaded():  # two trials share two cores
        return _run(cfg, mask_fn, reporter, workdir, should_stop, note)


def _run(cfg, mask_fn, reporter, workdir, should_stop, note) -> dict[str, float]:
    started = time.perf_counter()
    budget = cfg.resolved()
    state = TrialState(cfg)
    if not state.resume(workdir, note):
        state.base_accuracy = evaluate(state, 0)
        reporter(0, {EVAL_METRIC: state.base_accuracy})
        state.save(workdir)
    stopped = False
    while state.step < budget.steps:
        if should_stop():
            stopped = True
            break
        step = state.step + 1
        metrics = rl_step(state, mask_fn, step)
        if step % budget.eval_every == 0 or step == budget.steps:
            metrics[EVAL_METRIC] = evaluate(state, step)
        state.step = step
        state.last_metrics = metrics
        reporter(step, metrics)
        if step % budget.checkpoint_every == 0 or step == budget.steps:
            state.save(workdir)
    if stopped:
        state.save(workdir)
    summary = dict(state.last_metrics)
    summary["sim/base_acc_mean_at_16"] = state.base_accuracy
    summary["sim/steps_done"] = float(state.step)
    summary["sim/stopped"] = float(stopped)
    summary["sim/wall_s"] = time.perf_counter() - started
    return summary
