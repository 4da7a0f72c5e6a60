"""The cost model: checkpoint bytes, the calibration, the collective timeout, the sweep's disk
need, and measured step times replacing the estimate."""

from __future__ import annotations

import pytest

from pdmask.registry import cost
from pdmask.registry.catalog import MODELS
from pdmask.registry.cost import Workload, collective_timeout, save_bytes, trial_cost
from pdmask.registry.plan import disk_need, plan_rows

PAPER = Workload(
    prompts=256,
    group_size=16,
    steps=300,
    val_prompts=60,
    val_samples=16,
    test_freq=10,
    save_freq=20,
    checkpoints_kept=2,
)


def test_a_save_is_fp32_weights_and_adam_state():
    # scale-path's figures: 366 GB per 30B save, 98 GB for 8B, 48 GB for 4B
    assert save_bytes("qwen3-30b-a3b-base") / 1e9 == pytest.approx(366.4, abs=0.1)
    assert save_bytes("qwen3-8b-base") / 1e9 == pytest.approx(98.3, abs=0.1)
    assert save_bytes("qwen3-4b-base") / 1e9 == pytest.approx(48.3, abs=0.1)
    params = MODELS["qwen3-4b-base"].shape.params_total()
    assert save_bytes("qwen3-4b-base", hf_weights=True) == params * (4 + 8 + 2)


def test_the_generation_mfu_reproduces_the_calibration_runs_ratio():
    for kind, (gen_s, update_s, update_mfu) in cost.CALIBRATION.items():
        # at equal tokens: generation / update time = (2 / 8) x update MFU / generation MFU
        assert (2 / 8) * update_mfu / cost.generation_mfu(kind) == pytest.approx(gen_s / update_s)


def test_a_trial_costs_its_steps_validations_startup_and_saves():
    c = trial_cost("qwen3-30b-a3b-base", "h20x32", PAPER)
    assert c.basis == "estimate" and c.gpus == 16
    total = PAPER.steps * c.step_seconds + c.validation_seconds + c.startup_seconds + c.save_seconds
    assert c.gpu_hours == pytest.approx(16 * total / 3600, rel=1e-3)
    assert c.save_seconds == pytest.approx(15 * 366.4, rel=1e-3)  # 15 saves at 1 GB/s
    assert c.running_disk_gb == pytest.approx(3 * 366.4, abs=0.2)  # 2 kept + the next
    assert c.finished_disk_gb == pytest.approx(30.53 * 4, abs=0.1)  # the last model shards
    # scale-path's independent estimate: 900-1,500 s per 30B step, 700-1,100 s per 4B step
    assert 900 <= c.step_seconds <= 1500
    assert 700 <= trial_cost("qwen3-4b-base", "h20x32", PAPER).step_seconds <= 1300


def test_a_measured_step_replaces_the_estimate():
    measured = trial_cost("qwen3-8b-base", "h20x32", PAPER, measured_step_seconds=1000.0)
    estimated = trial_cost("qwen3-8b-base", "h20x32", PAPER)
    assert (measured.basis, measured.step_seconds) == ("measured", 1000.0)
    extra = PAPER.steps * (estimated.step_seconds - 1000.0) * 8 / 3600
    assert estimated.gpu_hours - measured.gpu_hours == pytest.approx(extra, abs=0.2)


def test_a_cpu_profile_costs_the_catalogs_measured_step():
    c = trial_cost("qwen3-tiny", "this-machine", PAPER)
    assert (c.basis, c.step_seconds) == (
        "catalog",
        MODELS["qwen3-tiny"].gpu_needs["CPU"].seconds_per_step,
    )


def test_the_collective_timeout_outlasts_a_save_with_a_floor(monkeypatch):
    assert collective_timeout("qwen3-4b-base") == cost.COLLECTIVE_TIMEOUT_FLOOR
    monkeypatch.setattr(cost, "SHARE_WRITE_GB_PER_S", 0.1)  # a slow share: 3,664 s a save
    expected = 3 * save_bytes("qwen3-30b-a3b-base") / 0.1e9
    assert collective_timeout("qwen3-30b-a3b-base") == int(expected) > 10_000


def test_the_sweeps_disk_need_adds_the_largest_running_set_to_the_finished_trials():
    from pdmask.registry import load_registry

    trials = load_registry().expand("main-figure", backend="verl")
    rows = plan_rows(trials, "h20x32", workloads={t.trial_hash: PAPER for t in trials})
    need = disk_need(rows, "h20x32")
    finished = 12 * 16.1 + 12 * 32.8 + 24 * 122.1
    assert need.finished_gb == pytest.approx(finished, abs=1)
    # two 30B trials fill the 32 GPUs: each holds 3 saves while running
    assert need.peak_gb == pytest.approx(finished + 2 * (1099.2 - 122.1), abs=1)
    assert need.uncleaned_gb == pytest.approx(12 * 96.6 + 12 * 196.6 + 24 * 732.8, abs=2)
    assert {r.cost_basis for r in rows} == {"estimate"}


MEGATRON = PAPER.model_copy(update={"training_engine": "megatron"})


def test_a_megatron_save_is_hf_weights_and_the_distributed_optimizers_fp32_state():
    """verl's Megatron checkpoint: the model slot is the HF export (bf16, 2 bytes; ``hf_model``
    deduplicated with it), the optimizer's shards hold the fp32 main copy and Adam's m and v
    (12 bytes), once per parameter over the data-parallel ranks: 14 bytes a parameter."""
    params = MODELS["qwen3-30b-a3b-base"].shape.params_total()
    megatron = save_bytes("qwen3-30b-a3b-base", engine="megatron")
    assert megatron == params * (2 + 4 + 8)
    assert save_bytes("qwen3-30b-a3b-base", hf_weights=True, engine="megatron") == megatron
    assert megatron / 1e9 == pytest.approx(427.4, abs=0.1)
    # the same model on FSDP: fp32 shards and Adam state, HF weights on top when asked
    assert save_bytes("qwen3-30b-a3b-base") == params * 12
    assert save_bytes("qwen3-30b-a3b-base", hf_weights=True) == megatron


def test_a_megatron_trial_saves_keeps_and_waits_by_its_own_checkpoint():
    fsdp = trial_cost("qwen3-30b-a3b-base", "h20x32", PAPER)
    c = trial_cost("qwen3-30b-a3b-base", "h20x32", MEGATRON)
    assert c.save_gb == pytest.approx(427.4, abs=0.1) and fsdp.save_gb == pytest.approx(366.4)
    assert c.save_seconds == pytest.approx(15 * 427.4, rel=1e-3)  # 15 saves at 1 GB/s
    assert c.running_disk_gb == pytest.approx(3 * 427.4, abs=0.2)
    # a finished trial keeps its last save's HF weights (its model slot), whatever the profile
    assert (c.finished_keeps, fsdp.finished_keeps) == ("hf-weights", "last-weights")
    assert c.finished_disk_gb == pytest.approx(30.53 * 2, abs=0.1)
    assert c.step_seconds == fsdp.step_seconds  # the step estimate is the engine's FLOPs alike


def test_the_collective_timeout_follows_the_engines_save(monkeypatch):
    assert collective_timeout("qwen3-30b-a3b-base", engine="megatron") == 1800  # the floor
    monkeypatch.setattr(cost, "SHARE_WRITE_GB_PER_S", 0.1)
    expected = 3 * save_bytes("qwen3-30b-a3b-base", engine="megatron") / 0.1e9
    assert collective_timeout("qwen3-30b-a3b-base", engine="megatron") == int(expected)
    assert int(expected) > collective_timeout("qwen3-30b-a3b-base")  # 14 bytes against 12
    c = trial_cost("qwen3-30b-a3b-base", "h20x32", MEGATRON)
    assert c.collective_timeout_s == int(expected)


def test_the_paper_plans_fp8_e2e_cells_with_megatron_saves():
    """On the paper's profile the job builder's workload says which engine trains each cell, so
    the plan sizes the FP8 E2E cells' saves as Megatron's and the others as FSDP's."""
    from pdmask.backends.verl.jobs import workload
    from pdmask.registry import load_registry

    trials = load_registry().expand("main-figure", backend="verl")
    loads = {t.trial_hash: workload(t, "h20x32") for t in trials}
    rows = {(r.model, r.precision): r for r in plan_rows(trials, "h20x32", workloads=loads)}
    e2e, rollout = rows["qwen3-30b-a3b-base", "fp8-e2e"], rows["qwen3-30b-a3b-base", "fp8-rollout"]
    assert {loads[t.trial_hash].training_engine for t in trials if t.precision == "fp8-e2e"} == {
        "megatron"
    }
    assert e2e.save_gb == pytest.approx(427.4, abs=0.1)
    assert rollout.save_gb == pytest.approx(366.4, abs=0.1)
    assert (e2e.disk_finished_gb, rollout.disk_finished_gb) == (61.1, 122.1)
    assert rows["qwen3-4b-base", "bf16"].save_gb == pytest.approx(48.3, abs=0.1)
