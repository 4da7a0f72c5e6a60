"""``train_trial``: the reporter contract, determinism, every method training, failures."""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.backends.sim import EVAL_METRIC, train_trial
from pdmask.backends.sim.checkpoint import read_checkpoint
from pdmask.errors import TrialFailed
from pdmask.trust_region import Method
from tests.methods import method as recipe_method
from tests.methods import project_recipes

PER_STEP = [
    "critic/score/mean",
    "actor/pdm/masked_frac",
    "actor/pdm/kl_topk_mean",
    "actor/pdm/disagree_agg",
    "actor/pdm/disagree_uni",
    "actor/pdm/disagree_bucket",
    "actor/pdm/mu_topk_mass",
    "actor/pdm/pi_topk_mass",
    "actor/pdm/global_term_mean",
    "actor/pdm/sign_match_agg",
    "actor/pdm/sign_match_uni",
    "actor/pdm/sign_match_bucket",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "actor/pdm/ratio_p01",
    "actor/pdm/ratio_p50",
    "actor/pdm/ratio_p99",
    "actor/pdm/mismatch_kl_topk",
    "response_length/mean",
    "response_length/p50",
    "response_length/p90",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "perf/tokens_per_s",
]
TIMING = {"perf/tokens_per_s", "sim/wall_s"}  # wall-clock: varies run to run


def run(cfg, tmp_path, method="pdm-agg", **kwargs):
    reports: list[tuple[int, dict]] = []
    final = train_trial(
        cfg,
        mask_fn=recipe_method(method, delta=0.15),
        reporter=lambda step, metrics: reports.append((step, dict(metrics))),
        workdir=tmp_path,
        **kwargs,
    )
    return reports, final


def test_reports_every_step_once_with_the_contract_metrics(smoke_config, tmp_path):
    cfg = smoke_config()
    reports, final = run(cfg, tmp_path)
    steps = [s for s, _ in reports]
    assert steps == list(range(cfg.resolved().steps + 1))
    assert set(reports[0][1]) == {EVAL_METRIC}  # step 0: the base model's evaluation
    for step, metrics in reports[1:]:
        assert set(PER_STEP) <= set(metrics), set(PER_STEP) - set(metrics)
        assert (EVAL_METRIC in metrics) == (step % 2 == 0)  # smoke: every 2 steps and the last
        assert all(math.isfinite(v) for v in metrics.values())
        assert 0 < metrics["actor/pdm/mu_topk_mass"] < 1  # the top-20 view truncates
    assert final[EVAL_METRIC] == reports[-1][1][EVAL_METRIC]
    assert final["sim/steps_done"] == cfg.resolved().steps
    assert (tmp_path / "checkpoint.pt").exists()


def test_same_seed_same_trial_other_seed_other_trial(smoke_config, tmp_path):
    def metrics(seed, where):
        reports, _ = run(smoke_config(seed=seed), tmp_path / where)
        return [{k: v for k, v in m.items() if k not in TIMING} for _, m in reports]

    first = metrics(5, "a")
    assert first == metrics(5, "b")
    assert first != metrics(6, "c")


@pytest.mark.parametrize("method", sorted(project_recipes()))
def test_every_method_trains(method, learned_base_config, tmp_path):
    from pdmask.backends.sim.state import TrialState

    cfg = learned_base_config()
    before = [p.detach().clone() for p in TrialState(cfg).trainer.parameters()]
    reports, final = run(cfg, tmp_path, method=method)
    assert final["sim/base_acc_mean_at_16"] > 0
    assert any(m["actor/grad_norm"] > 0 for _, m in reports[1:])
    after = read_checkpoint(tmp_path / "checkpoint.pt")["state"]["trainer"]
    moved = [not torch.equal(b, a) for b, a in zip(before, after.values(), strict=True)]
    assert any(moved)


def test_non_finite_loss_fails_the_trial(smoke_config, tmp_path):
    def poisoned(batch):
        batch.log_prob.data.fill_(math.nan)  # as if the forward had overflowed
        return torch.zeros_like(batch.response_mask)

    with pytest.raises(TrialFailed, match="non-finite"):
        train_trial(
            smoke_config(),
            mask_fn=Method("poisoned", mask=poisoned),
            reporter=lambda *a: None,
            workdir=tmp_path,
        )


def test_should_stop_checkpoints_and_a_rerun_continues(smoke_config, tmp_path):
    cfg = smoke_config(steps=4, checkpoint_every=3)
    calls = iter(range(100))
    first, partial = run(cfg, tmp_path, should_stop=lambda: next(calls) >= 2)
    assert [s for s, _ in first] == [0, 1, 2] and partial["sim/stopped"] == 1.0
    second, final = run(cfg, tmp_path)
    assert [s for s, _ in second] == [3, 4]
    assert final["sim/stopped"] == 0.0 and final["sim/steps_done"] == 4


def test_a_checkpoint_of_another_config_is_refused(smoke_config, tmp_path):
    from pdmask.errors import ConfigError

    run(smoke_config(steps=2), tmp_path)
    with pytest.raises(ConfigError, match="another trial config"):
        run(smoke_config(steps=2, seed=9), tmp_path)


def _step_one_reference(cfg):
    """The step-1 rollout and its first minibatch, rebuilt from the trial's own random streams."""
    from pdmask.backends.sim.state import TrialState, step_generator

    state = TrialState(cfg)
    generator = step_generator(cfg.seed, 1, "rollout")
    state.trainer.train()
    batch = state.rollout(generator)
    order = torch.randperm(batch.size, generator=generator)
    return state, batch, order.chunk(cfg.resolved().minibatches)


def test_entropy_is_verls_mean_token_entropy_of_the_policy_before_the_update(
    smoke_config, tmp_path
):
    """actor/entropy: the trainer's policy at the step's starting parameters, token-mean over the
    response tokens of the first minibatch (float64 reference; float32 sums over 1,025 terms of at
    most 0.37 each are good to ~5e-5)."""
    from pdmask.backends.sim.grpo import trainer_logits
    from pdmask.backends.sim.trainer import rl_step

    cfg = smoke_config()
    state, batch, minibatches = _step_one_reference(cfg)
    with torch.no_grad():
        logp = torch.log_softmax(trainer_logits(state.trainer, batch, minibatches[0]).double(), -1)
    entropy = -(logp.exp() * logp).sum(-1)[batch.valid[minibatches[0]]].mean()
    metrics = rl_step(state, recipe_method("pdm-agg", delta=0.15), 1)
    assert metrics["actor/entropy"] == pytest.approx(float(entropy), abs=1e-4)
    assert 0 < metrics["actor/entropy"] < math.log(cfg.task_spec.vocab_size)


def test_the_lr_zero_control_never_moves_the_policy_and_logs_the_mismatch(smoke_config, tmp_path):
    from pdmask.backends.sim.grpo import trainer_logits

    cfg = smoke_config(lr=0.0, precision="fp8-rollout")
    state, batch, _ = _step_one_reference(cfg)
    before = {k: v.clone() for k, v in state.trainer.state_dict().items()}
    with torch.no_grad():
        logits = trainer_logits(state.trainer, batch, torch.arange(batch.size))
    logp = torch.log_softmax(logits.double(), -1)
    taken = logp.gather(-1, batch.generation.responses.unsqueeze(-1)).squeeze(-1)
    ratio = (taken - batch.generation.mu_logp.double()).exp()[batch.valid]

    reports, _ = run(cfg, tmp_path)
    after = read_checkpoint(tmp_path / "checkpoint.pt")["state"]["trainer"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was learned
    step_one = reports[1][1]
    assert "actor/grad_norm" not in step_one  # no backward pass was taken
    assert step_one["actor/pdm/mismatch_kl_topk"] > 0  # FP8 rollout: a real mismatch
    # Every minibatch meets the same parameters, so the step's ratios are the whole batch's at
    # once (float32 ratios: relative error ~ eps * |log pi| < 1e-5).
    for name, q in {"p01": 0.01, "p50": 0.5, "p99": 0.99}.items():
        expected = float(torch.quantile(ratio, q))
        assert step_one[f"actor/pdm/ratio_{name}"] == pytest.approx(expected, rel=1e-5)
    assert step_one["actor/pdm/ratio_p01"] < 1 < step_one["actor/pdm/ratio_p99"]


def test_a_recipes_own_scalar_is_logged_each_step(smoke_config, tmp_path):
    """RecipeBatch.report: the mask's own share, reported by the recipe, is logged under
    actor/pdm/recipe/ and equals the share the trainer logs itself (same tokens, same means)."""
    from pdmask.trust_region import RECIPE_METRIC_PREFIX

    def upper_half(batch):
        kl = batch.stats.kl_topk
        mask = (kl > kl[batch.response_mask].median()) & batch.response_mask
        batch.report("outside_share", mask[batch.response_mask].float().mean())
        return mask

    reports = []
    train_trial(
        smoke_config(),
        mask_fn=Method("reporting", mask=upper_half),
        reporter=lambda step, metrics: reports.append(dict(metrics)),
        workdir=tmp_path,
    )
    key = RECIPE_METRIC_PREFIX + "outside_share"
    reports = [m for m in reports if "actor/pdm/masked_frac" in m]  # the training steps
    assert reports and all(key in m for m in reports), reports[0].keys()
    for m in reports:
        assert m[key] == pytest.approx(m["actor/pdm/masked_frac"], rel=1e-6)
        assert 0.3 < m[key] < 0.7


def test_the_output_layer_control_trains_the_lm_head_alone(learned_base_config, tmp_path):
    """sim.train_layers = output: the lm head moves, every parameter below it stays bit-equal;
    the default config's checkpoint identity does not name the knob (older checkpoints resume)."""
    from pdmask.backends.sim.state import TrialState

    cfg = learned_base_config(train_layers="output")
    before = TrialState(cfg).trainer.state_dict()
    before = {k: v.clone() for k, v in before.items()}
    reports, _ = run(cfg, tmp_path)
    assert any(m["actor/grad_norm"] > 0 for _, m in reports[1:])
    after = read_checkpoint(tmp_path / "checkpoint.pt")["state"]["trainer"]
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved == {"lm_head.weight"}
    assert "train_layers" in TrialState(cfg).identity()
    assert "train_layers" not in TrialState(learned_base_config()).identity()
