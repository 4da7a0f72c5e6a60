"""Trial config validation and profile overrides."""

from __future__ import annotations

from typing import get_args

import pytest

from pdmask.backends.sim import PRECISIONS, PROFILES, STAND_INS, SimTrialConfig
from pdmask.errors import ConfigError, ValidationFailed
from pdmask.registry.sweeps import SIM_PROFILES
from pdmask.trust_region import AGG_MODES


def test_presets_cover_the_registry_names():
    fields = SimTrialConfig.model_fields
    assert set(STAND_INS) == set(get_args(fields["stand_in"].annotation))
    assert set(PROFILES) == set(get_args(fields["profile"].annotation)) == set(SIM_PROFILES)
    assert set(AGG_MODES) == set(get_args(fields["loss_agg_mode"].annotation))
    assert PRECISIONS == ("bf16", "fp8-rollout", "fp8-e2e")
    assert PROFILES["smoke"].steps < PROFILES["default"].steps < PROFILES["full"].steps


def test_every_field_is_documented():
    for model in (SimTrialConfig, type(PROFILES["smoke"]), type(STAND_INS["tiny-4b"])):
        undocumented = [n for n, f in model.model_fields.items() if not f.description]
        assert not undocumented, f"{model.__name__}: {undocumented}"


def test_overrides_replace_profile_values_and_none_keeps_them():
    cfg = SimTrialConfig(stand_in="tiny-4b", precision="bf16", seed=1, delta=0.15, lr=1e-4)
    budget = cfg.resolved()
    assert budget.lr == 1e-4
    assert budget.steps == PROFILES["default"].steps


def test_all_problems_are_reported_at_once_with_file_and_field():
    bad = {"stand_in": "tiny-70b", "precision": "fp4", "seed": 0, "lr": -1, "colour": "red"}
    with pytest.raises(ValidationFailed) as err:
        SimTrialConfig.from_mapping(bad, file="sweeps/main-figure.yaml")
    fields = {p.field for p in err.value.problems}
    assert {"stand_in", "precision", "lr", "colour"} <= fields
    assert all(p.file == "sweeps/main-figure.yaml" for p in err.value.problems)
    assert isinstance(err.value, ConfigError)


def test_minibatches_must_split_the_rollout_batch():
    with pytest.raises(ValidationFailed, match="not divisible"):
        SimTrialConfig.from_mapping(
            {"stand_in": "tiny-4b", "precision": "bf16", "seed": 0, "delta": 0.15, "minibatches": 7}
        )


def test_evaluation_cannot_ask_for_more_problems_than_are_held_out():
    with pytest.raises(ValidationFailed, match="held-out problems"):
        SimTrialConfig.from_mapping(
            {
                "stand_in": "tiny-4b",
                "precision": "bf16",
                "seed": 0,
                "delta": 0.15,
                "eval_problems": 10_000,
            }
        )


def test_the_sweep_reachable_knobs_are_the_backends_and_name_its_task_regimes():
    from pdmask.backends.sim.task import TASKS
    from pdmask.registry.sim_knobs import SimKnobs, TaskName

    assert set(get_args(TaskName)) == set(TASKS)
    assert set(SimKnobs.model_fields) <= set(SimTrialConfig.model_fields)  # inherited, one home
    llm = SimTrialConfig(stand_in="tiny-4b", precision="bf16", seed=0, delta=0.15, task="llm-like")
    assert llm.task_spec is TASKS["llm-like"]
    assert (
        SimTrialConfig(stand_in="tiny-4b", precision="bf16", seed=0, delta=0.15).task_spec
        is TASKS["synonyms"]
    )


def test_lr_zero_is_the_mismatch_control_and_negative_rates_are_refused():
    control = SimTrialConfig(stand_in="tiny-4b", precision="bf16", seed=0, delta=0.15, lr=0)
    assert control.resolved().lr == 0 and not control.learns
    assert SimTrialConfig(stand_in="tiny-4b", precision="bf16", seed=0, delta=0.15).learns
    with pytest.raises(ValidationFailed, match="lr"):
        SimTrialConfig.from_mapping(
            {"stand_in": "tiny-4b", "precision": "bf16", "seed": 0, "delta": 0.15, "lr": -1e-4}
        )
