"""``train_trial``: the reporter contract, determinism, every method training, failures."""

from __future__ import annotations

import math

import pytest
import torch

from pdmask.backends.sim import EVAL_METRIC, train_trial
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
    after = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["state"]["trainer"]
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
