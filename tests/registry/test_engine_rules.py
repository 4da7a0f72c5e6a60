"""The engine rules over the real Qwen3-4B/8B/30B-A3B shapes, every shipped cluster profile and
every precision; the rules agree with vLLM's own checks where the CPU build has them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pdmask.registry.catalog import CLUSTERS, MODELS, PRECISIONS
from pdmask.registry.engine_rules import (
    ROLLOUT_NUMERICS,
    EngineRefusal,
    _fp8_experts,
    _fp8_linear,
    check_layout,
    rollout_layout,
)

PAPER_MODELS = ("qwen3-4b-base", "qwen3-8b-base", "qwen3-30b-a3b-base")
GPU_PROFILES = [c for c, p in CLUSTERS.items() if p.device == "gpu"]


def test_every_precision_says_what_it_asks_of_vllm():
    assert set(ROLLOUT_NUMERICS) == set(PRECISIONS)


@pytest.mark.parametrize("cluster", GPU_PROFILES)
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("model", PAPER_MODELS)
def test_every_paper_cell_gets_a_layout_that_passes_every_rule(model, precision, cluster):
    layout = rollout_layout(model, precision, cluster)
    profile, shape = CLUSTERS[cluster], MODELS[model].shape
    gpus = MODELS[model].gpu_needs[profile.gpu_kind].gpus
    broken = check_layout(
        shape, ROLLOUT_NUMERICS[precision], profile, gpus, layout.tp, layout.expert_parallel, 0.6
    )
    assert broken == [] and layout.replicas * layout.tp == gpus
    assert not layout.expert_parallel  # plain TP passes for every paper cell
    if ROLLOUT_NUMERICS[precision].weights == "fp8" and shape.is_moe:
        # 768 / 4 = 192: refused; TP 2 (384 per rank) is the nearest below the preferred 4
        assert layout.tp == 2 and "192 is not divisible by block_n 128" in layout.why
    else:
        assert layout.tp == MODELS[model].rollout_tp  # the preferred size passes


def test_the_30b_at_tp4_in_fp8_breaks_exactly_the_expert_block_rule():
    shape = MODELS["qwen3-30b-a3b-base"].shape
    fp8 = ROLLOUT_NUMERICS["fp8-rollout"]
    broken = check_layout(shape, fp8, CLUSTERS["h20x32"], 16, 4, False, 0.6)
    assert [v.rule for v in broken] == ["fp8-block-experts"]
    # expert parallelism keeps experts whole (768): TP 4 + EP passes, and TP 8 breaks
    assert check_layout(shape, fp8, CLUSTERS["h20x32"], 16, 4, True, 0.6) == []
    assert [v.rule for v in check_layout(shape, fp8, CLUSTERS["h20x32"], 16, 8, False, 0.6)] == [
        "fp8-block-experts"
    ]
    # in BF16 nothing is blocked: TP 4 is fine
    assert (
        check_layout(shape, ROLLOUT_NUMERICS["bf16"], CLUSTERS["h20x32"], 16, 4, False, 0.6) == []
    )


def test_heads_kv_heads_placement_and_memory_are_each_refused_by_name():
    shape = MODELS["qwen3-8b-base"].shape  # 32 heads, 8 KV heads
    bf16, h20 = ROLLOUT_NUMERICS["bf16"], CLUSTERS["h20x32"]
    assert {v.rule for v in check_layout(shape, bf16, h20, 24, 3, False, 0.6)} >= {
        "heads",
        "kv-heads",
    }
    odd = shape.model_copy(update={"num_attention_heads": 48, "num_kv_heads": 12})
    assert [v.rule for v in check_layout(odd, bf16, h20, 8, 8, False, 0.6)] == ["kv-heads"]
    assert [v.rule for v in check_layout(shape, bf16, h20, 8, 16, False, 0.6)][0] == "placement"
    assert [v.rule for v in check_layout(shape, bf16, h20, 8, 1, True, 0.6)] == ["expert-parallel"]
    small = h20.model_copy(update={"gpu_memory_gb": 16})
    assert [v.rule for v in check_layout(shape, bf16, small, 8, 1, False, 0.6)] == ["kv-memory"]
    assert check_layout(shape, bf16, small, 8, 4, False, 0.6) == []  # a quarter of the weights


def test_a_cell_nothing_passes_is_refused_naming_each_rule():
    with pytest.raises(EngineRefusal, match="placement"):
        rollout_layout("qwen3-8b-base", "bf16", "this-machine")  # no CPU need


def test_a_model_without_shapes_keeps_its_hand_set_tp():
    layout = rollout_layout("qwen3-tiny", "bf16", "this-machine")
    assert (layout.tp, layout.replicas, layout.why) == (1, 1, "set by hand (no shapes to check)")


def test_parameter_counts_from_the_shapes_match_the_published_ones():
    for name in PAPER_MODELS:
        spec = MODELS[name]
        assert spec.shape.params_total() == pytest.approx(spec.params_total_b * 1e9, rel=0.01)
        assert spec.shape.params_active() == pytest.approx(spec.params_active_b * 1e9, rel=0.02)


def test_parameter_counts_equal_transformers_models_built_from_the_shapes():
    """Brute force: build each model on the meta device and count its parameters."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name in PAPER_MODELS:
        s = MODELS[name].shape
        common = dict(
            hidden_size=s.hidden_size,
            num_hidden_layers=s.num_layers,
            num_attention_heads=s.num_attention_heads,
            num_key_value_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            intermediate_size=s.intermediate_size,
            vocab_size=s.vocab_size,
            tie_word_embeddings=s.tie_word_embeddings,
        )
        if s.is_moe:
            config = transformers.Qwen3MoeConfig(
                **common,
                num_experts=s.num_experts,
                num_experts_per_tok=s.num_experts_per_tok,
                moe_intermediate_size=s.moe_intermediate_size,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            )
        else:
            config = transformers.Qwen3Config(**common)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        counted = sum(p.numel() for p in model.parameters())  # tied weights counted once
        assert counted == s.params_total(), name


@pytest.mark.parametrize("width", [192, 256, 384, 640, 768, 1536])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_expert_rule_agrees_with_vllms_own_check(monkeypatch, width, tp):
    """vLLM 0.31's ``validate_fp8_block_shape_moe`` (the CPU build installed for the tests; 0.24.0's
    ``Fp8MoEMethod.create_weights`` has the same two conditions inline)."""
    pytest.importorskip("vllm")
    import vllm.distributed
    from vllm.model_executor.layers.quantization.utils import fp8_utils

    monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: tp)
    shape = MODELS["qwen3-30b-a3b-base"].shape.model_copy(update={"moe_intermediate_size": width})
    try:
        fp8_utils.validate_fp8_block_shape_moe(width // tp, [128, 128])
        vllm_refuses = False
    except ValueError:
        vllm_refuses = True
    assert bool(_fp8_experts(shape, tp, ep=False)) == vllm_refuses


@pytest.mark.parametrize("intermediate", [9728, 12288, 1000, 2816])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_linear_rule_agrees_with_vllms_own_check(monkeypatch, intermediate, tp):
    """``validate_fp8_block_shape`` on each of the Qwen3 layer's linear layers, with the
    partitions vLLM's parallel linear layers give them."""
    pytest.importorskip("vllm")
    import vllm.distributed
    from vllm.model_executor.layers.quantization.utils import fp8_utils

    monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: tp)

    s = MODELS["qwen3-8b-base"].shape.model_copy(update={"intermediate_size": intermediate})
    h, d, q = s.hidden_size, s.head_dim, s.num_attention_heads * s.head_dim
    kv = max(1, s.num_kv_heads // tp) * d
    layers = [  # input, input per rank, output, output partitions per rank
        (h, h, q + 2 * s.num_kv_heads * d, [q // tp, kv, kv]),
        (q, q // tp, h, [h]),
        (h, h, 2 * intermediate, [intermediate // tp] * 2),
        (intermediate, intermediate // tp, h, [h]),
    ]
    vllm_refuses = False
    for inputs, per_rank, outputs, parts in layers:
        try:
            fp8_utils.validate_fp8_block_shape(
                SimpleNamespace(tp_size=tp), inputs, outputs, per_rank, parts, [128, 128]
            )
        except ValueError:
            vllm_refuses = True
    assert bool(_fp8_linear(s, tp)) == vllm_refuses
