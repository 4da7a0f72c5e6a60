"""Megatron's training layout from each model's shapes (registry/training_layout.py): the paper's
MoE setting gets verl's example layout, every rule names itself when broken, and the catalog
says in one place which engine each setting trains on."""

from __future__ import annotations

import pytest

from pdmask.registry.catalog import CLUSTERS, MODELS, training_engine
from pdmask.registry.training_layout import (
    TrainingRefusal,
    check_training_layout,
    state_bytes_per_gpu,
    training_layout,
)

GPU_PROFILES = [name for name, c in CLUSTERS.items() if c.device == "gpu"]
PAPER_MODELS = ["qwen3-4b-base", "qwen3-8b-base", "qwen3-30b-a3b-base"]


def test_fp8_end_to_end_trains_on_megatron_on_the_papers_profile_only():
    assert training_engine("fp8-e2e", "h20x32") == "megatron"
    for precision in ("bf16", "fp8-rollout"):
        assert training_engine(precision, "h20x32") == "fsdp"
    for cluster in CLUSTERS:
        if cluster != "h20x32":
            assert training_engine("fp8-e2e", cluster) == "fsdp"


def test_the_papers_moe_gets_tp2_ep8_in_fp8():
    layout = training_layout("qwen3-30b-a3b-base", "fp8-e2e", "h20x32", fp8=True)
    assert (layout.tp, layout.pp, layout.ep, layout.etp) == (2, 1, 8, 1)
    assert layout.fp8 and layout.why == "passes every rule"
    assert layout.data_parallel(16) == 8


@pytest.mark.parametrize("cluster", GPU_PROFILES)
@pytest.mark.parametrize("model", PAPER_MODELS)
def test_every_paper_model_has_a_layout_on_every_gpu_profile(model, cluster):
    layout = training_layout(model, "fp8-e2e", cluster, fp8=True)
    gpus = MODELS[model].gpu_needs[CLUSTERS[cluster].gpu_kind].gpus
    shape = MODELS[model].shape
    assert gpus % (layout.tp * layout.pp) == 0 and gpus % (layout.ep * layout.etp * layout.pp) == 0
    assert shape.num_kv_heads % layout.tp == 0 and shape.num_layers % layout.pp == 0
    assert layout.state_gib_per_gpu * 2**30 <= CLUSTERS[cluster].gpu_memory_gb * 1e9 * 0.6


def _rules(broken):
    return {v.rule for v in broken}


def test_each_broken_rule_is_named():
    shape = MODELS["qwen3-30b-a3b-base"].shape
    h20, cpu = CLUSTERS["h20x32"], CLUSTERS["this-machine"]
    assert _rules(check_training_layout(shape, h20, 16, 16, 1, 8, 1, False)) >= {"placement"}
    assert "heads" in _rules(check_training_layout(shape, h20, 16, 8, 1, 8, 1, False))
    assert "layers" in _rules(check_training_layout(shape, h20, 16, 2, 5, 1, 1, False))
    assert "experts" in _rules(check_training_layout(shape, h20, 16, 2, 1, 3, 1, False))
    assert "fp8-training-gpu" in _rules(check_training_layout(shape, cpu, 1, 1, 1, 1, 1, True))
    # an expert of 768 over 5 ETP ranks is no FP8 GEMM width
    assert "fp8-training-dims" in _rules(check_training_layout(shape, h20, 16, 2, 1, 1, 5, True))
    dense = MODELS["qwen3-8b-base"].shape
    assert _rules(check_training_layout(dense, h20, 8, 1, 1, 1, 1, False)) == {"train-memory"}
    assert _rules(check_training_layout(dense, h20, 8, 1, 1, 2, 1, False)) == {"experts"}


def test_the_state_estimate_counts_experts_over_expert_parallel_ranks():
    shape = MODELS["qwen3-30b-a3b-base"].shape
    # 16 GPUs: more expert parallelism shrinks the experts' share, not the dense part's
    assert state_bytes_per_gpu(shape, 16, 2, 1, 8, 1) < state_bytes_per_gpu(shape, 16, 2, 1, 4, 1)
    experts = shape.num_layers * shape.num_experts * 3 * shape.hidden_size * 768
    assert 0.9 * shape.params_total() < experts < shape.params_total()


def test_a_cell_without_a_layout_is_refused_naming_why():
    with pytest.raises(TrainingRefusal, match="qwen3-tiny: no shapes to derive a layout from"):
        training_layout("qwen3-tiny", "fp8-e2e", "this-machine", fp8=True)
    with pytest.raises(TrainingRefusal, match="no need on this GPU kind"):
        training_layout("qwen3-30b-a3b-base", "bf16", "this-machine", fp8=False)
