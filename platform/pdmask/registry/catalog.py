"""The fixed catalog: models, precisions and cluster profiles, typed and documented.

Numbers marked *estimate* are planning defaults, not measurements. A model's shapes are its
published ``config.json`` values (``model_shape.py``); from them the engine rules derive its
rollout layout (``engine_rules.py``) and the cost model its step time and checkpoint size
(``cost.py``); measured step times replace the estimate once trials report (``pdm sweep
--dry-run``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pdmask.registry.model_shape import ModelShape


class GpuNeed(BaseModel):
    """What one trial of a model needs on one kind of GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(description="GPUs per trial (all on whole nodes when > gpus_per_node).")
    seconds_per_step: float = Field(
        description="Wall seconds per RL step, set by hand (*estimate*): the fallback of a model "
        "with no shapes or a backend with no workload; `cost.py` derives the step time of the "
        "others from their shapes."
    )


class ModelSpec(BaseModel):
    """A model of the paper, its VeRL defaults and its stand-in on the embedded backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Registry name used in sweeps and the `pdm.model` tag.")
    label: str = Field(description="Short label for figure panels (cosmetic).")
    hub_id: str = Field(
        description="Hugging Face id (downloaded by the cluster nodes, never here)."
    )
    built_here: bool = Field(
        False,
        description="Made by pdmask itself and cached in the state folder (never downloaded): "
        "`python -m pdmask.backends.verl.tiny_model`; hub_id is then only a label.",
    )
    logits_width: int = Field(
        description="Padded lm-head width n: the uniform estimator divides by n - m."
    )
    params_total_b: float = Field(description="Total parameters, billions.")
    params_active_b: float = Field(
        description="Active parameters per token, billions (MoE < total)."
    )
    gpu_needs: dict[str, GpuNeed] = Field(description="Per GPU kind (H20, H100, H200).")
    shape: ModelShape | None = Field(
        None,
        description="The model's `config.json` shapes; None for a model pdmask builds itself "
        "(its rollout TP is then `rollout_tp` as set, unchecked).",
    )
    rollout_tp: int | None = Field(
        None,
        description="Preferred vLLM tensor-parallel size for rollout (throughput); the engine "
        "rules check it per precision and GPU and pick the nearest size vLLM accepts "
        "(`engine_rules.rollout_layout`). None: the smallest size vLLM accepts.",
    )
    train_tp: int | None = Field(
        None,
        description="Preferred Megatron tensor-parallel size for training, where a setting "
        "trains on Megatron (`training_engine`); checked per precision and GPU like the rollout's "
        "(`training_layout.training_layout`). None: the smallest size Megatron accepts.",
    )
    ulysses_sp: int = Field(1, description="Ulysses sequence-parallel size for the actor.")
    param_offload: bool = Field(False, description="FSDP parameter offload for the actor.")
    sim_stand_in: str = Field(
        description="Embedded-backend stand-in (a small model of growing size)."
    )


TrainingEngine = Literal["fsdp", "megatron"]
"""verl's actor engines pdmask runs: FSDP2 (its default) or Megatron-Core (`training_engine`)."""


class PrecisionSpec(BaseModel):
    """A precision setting: what it means for VeRL and for the embedded backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Registry name used in sweeps and the `pdm.precision` tag.")
    label: str = Field(
        description="Short label where no backend is known (a figure panel without runs, or "
        "with runs of several backends): it claims nothing some backend does not do."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Per backend name, what the setting is on that backend, as figure panels, "
        "run descriptions and the `pdm.precision_label` tag name it; `label` for a backend "
        "not listed.",
    )
    verl: str = Field(description="What VeRL runs: rollout and trainer numerics.")
    sim: str = Field(description="What the embedded backend emulates.")
    megatron: str | None = Field(
        None,
        description="What VeRL runs where the setting trains on verl's Megatron engine "
        "(`training_engine`), when that differs from `verl`; None: as `verl` says.",
    )
    megatron_label: str | None = Field(
        None, description="The panel label on the Megatron engine; None: `label`."
    )
    megatron_fp8: bool = Field(
        False,
        description="On the Megatron engine the actor trains in FP8 (Transformer Engine, "
        "block-wise e4m3): verl-recipe's FP8 end-to-end keys.",
    )

    def on_engine(self, engine: TrainingEngine) -> tuple[str, str]:
        """(label, what VeRL runs) on a training engine of the VeRL backend."""
        verl = self.megatron or self.verl if engine == "megatron" else self.verl
        return self.label_on("verl", engine), verl

    def label_on(self, backend: str | None, engine: TrainingEngine | None = None) -> str:
        """What the setting is on ``backend`` (None: unknown, ``label``), trained on ``engine``
        (verl's Megatron engine may train what its FSDP engine cannot: FP8)."""
        if engine == "megatron" and self.megatron_label:
            return self.megatron_label
        return self.labels.get(backend, self.label) if backend else self.label


class ClusterProfile(BaseModel):
    """A cluster to plan for: GPU-hours and how many trials fit at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Profile name, e.g. `h20x32`.")
    nodes: int = Field(description="Nodes in the cluster.")
    gpus_per_node: int = Field(description="GPUs per node.")
    gpu_kind: str = Field(description="GPU kind, a key of ModelSpec.gpu_needs.")
    gpu_memory_gb: int = Field(description="Memory per GPU, GB.")
    device: Literal["gpu", "cpu"] = Field(
        "gpu",
        description="`cpu`: this machine's CPU cores stand in for the GPUs (logical GPUs in a "
        "local Ray head, verl's CPU platform, vLLM's CPU build): integration tests and "
        "`verl-smoke`, never the paper's numbers.",
    )
    job_startup_seconds: float = Field(
        3600.0,
        description="How long a VeRL job may run before its first finished step or validation "
        "(model loading, vLLM start, the first weight sync, the validation before training) "
        "before its watchdog ends it as stalled (`backends/verl/watchdog.py`).",
    )

    finished_checkpoint: Literal["last-weights", "hf-weights"] = Field(
        "last-weights",
        description="What a FINISHED trial keeps on the checkpoint root once `pdm clean` ran "
        "(a running trial keeps verl's saves whole: optimizer state is what resumes it): "
        "`last-weights`, its last save's model shards and HF config (`verl.model_merger` turns "
        "them into HF weights); `hf-weights`, only HF weights, which every save then also "
        "writes (`hf_model`: 2 bytes a parameter more per save).",
    )
    megatron_precisions: tuple[str, ...] = Field(
        (),
        description="Precision settings whose VeRL trials train on verl's Megatron engine on "
        "this profile (every other one on FSDP): `training_engine`.",
    )

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _needs(
    h20: tuple[int, float], h100: tuple[int, float], h200: tuple[int, float], **more
) -> dict[str, GpuNeed]:
    return {
        k: GpuNeed(gpus=g, seconds_per_step=s)
        for k, (g, s) in {"H20": h20, "H100": h100, "H200": h200, **more}.items()
    }


_SOURCE = (
    "{hub} config.json: the values NVIDIA NeMo's {cls} (nemo/collections/llm/gpt/model/qwen3.py) "
    "and the model card give; max_position_embeddings 32768 is the Base models' (the post-trained "
    "ones say 40960)"
)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec(
            name="qwen3-4b-base",
            label="Qwen3-4B",
            hub_id="Qwen/Qwen3-4B-Base",
            logits_width=151_936,
            shape=ModelShape(
                hidden_size=2560,
                num_layers=36,
                num_attention_heads=32,
                num_kv_heads=8,
                head_dim=128,
                intermediate_size=9728,
                vocab_size=151_936,
                tie_word_embeddings=True,
                max_position_embeddings=32_768,
                source=_SOURCE.format(hub="Qwen/Qwen3-4B-Base", cls="Qwen3Config4B"),
            ),
            params_total_b=4.0,
            params_active_b=4.0,
            gpu_needs=_needs((8, 420.0), (8, 200.0), (8, 170.0)),
            rollout_tp=1,
            sim_stand_in="tiny-4b",
        ),
        ModelSpec(
            name="qwen3-8b-base",
            label="Qwen3-8B",
            hub_id="Qwen/Qwen3-8B-Base",
            logits_width=151_936,
            shape=ModelShape(
                hidden_size=4096,
                num_layers=36,
                num_attention_heads=32,
                num_kv_heads=8,
                head_dim=128,
                intermediate_size=12_288,
                vocab_size=151_936,
                tie_word_embeddings=False,
                max_position_embeddings=32_768,
                source=_SOURCE.format(hub="Qwen/Qwen3-8B-Base", cls="Qwen3Config8B"),
            ),
            params_total_b=8.2,
            params_active_b=8.2,
            gpu_needs=_needs((8, 650.0), (8, 300.0), (8, 260.0)),
            rollout_tp=2,
            sim_stand_in="tiny-8b",
        ),
        ModelSpec(
            name="qwen3-30b-a3b-base",
            label="Qwen3-30B-A3B",
            hub_id="Qwen/Qwen3-30B-A3B-Base",
            logits_width=151_936,
            shape=ModelShape(
                hidden_size=2048,
                num_layers=48,
                num_attention_heads=32,
                num_kv_heads=4,
                head_dim=128,
                intermediate_size=6144,
                vocab_size=151_936,
                tie_word_embeddings=False,
                max_position_embeddings=32_768,
                num_experts=128,
                num_experts_per_tok=8,
                moe_intermediate_size=768,
                source=_SOURCE.format(hub="Qwen/Qwen3-30B-A3B-Base", cls="Qwen3Config30B_A3B"),
            ),
            params_total_b=30.5,
            params_active_b=3.3,
            gpu_needs=_needs((16, 720.0), (16, 330.0), (8, 420.0)),
            rollout_tp=4,
            # verl's Qwen3-30B-A3B Megatron examples: TP 2 with the experts on EP 8
            train_tp=2,
            ulysses_sp=1,
            param_offload=False,
            sim_stand_in="tiny-30b-a3b",
        ),
        ModelSpec(
            name="qwen3-tiny",
            label="tiny Qwen3",
            hub_id="pdmask/qwen3-tiny",
            built_here=True,
            logits_width=512,
            params_total_b=0.0002,
            params_active_b=0.0002,
            # CPU: one logical GPU = one training process on this machine's cores (measured
            # ~3 s per step after ~95 s of start-up on 2 cores).
            gpu_needs=_needs((1, 2.0), (1, 2.0), (1, 2.0), CPU=(1, 3.0)),
            rollout_tp=1,
            sim_stand_in="tiny-4b",
        ),
        ModelSpec(
            name="qwen3-tiny-moe",
            label="tiny Qwen3-MoE",
            hub_id="pdmask/qwen3-tiny-moe",
            built_here=True,
            logits_width=512,
            params_total_b=0.00036,
            params_active_b=0.00026,  # 2 of 4 experts per token
            # The real shape at toy size: two training processes (FSDP over gloo on CPU) and one
            # vLLM engine over both at tensor parallel 2 (measured 3.4-4.7 s per step on 2
            # loaded cores).
            gpu_needs=_needs((2, 2.0), (2, 2.0), (2, 2.0), CPU=(2, 5.0)),
            rollout_tp=2,
            sim_stand_in="tiny-30b-a3b",
        ),
    ]
}

PRECISIONS: dict[str, PrecisionSpec] = {
    p.name: p
    for p in [
        PrecisionSpec(
            name="bf16",
            label="BF16",
            verl="vLLM rollout in BF16; FSDP actor in BF16 mixed precision (fp32 master).",
            sim="Trainer in float32; behaviour copy runs its forward in bfloat16.",
        ),
        PrecisionSpec(
            name="fp8-rollout",
            label="FP8 rollout",
            verl="vLLM rollout with FP8 (e4m3) weight quantisation, re-quantised after each "
            "weight sync; FSDP actor in BF16.",
            sim="Behaviour copy's weights quantised to float8 e4m3 (scaled) and back; "
            "trainer in float32.",
        ),
        PrecisionSpec(
            name="fp8-e2e",
            # The paper's "FP8 end-to-end" trains in FP8 (Megatron + TransformerEngine); verl
            # 0.9.1's FSDP engine, the one whose logits pdmask's hook sees, trains in BF16 only.
            label="fp8-e2e",
            labels={
                "verl": "FP8 rollout + KV cache, BF16 training",
                "sim": "FP8 end-to-end (emulated)",
            },
            verl="vLLM rollout with FP8 (e4m3) weights, as fp8-rollout, plus an FP8 KV cache; "
            "FSDP actor in BF16 (not the paper's FP8 training: the VeRL backend's README says "
            "why).",
            sim="FP8 behaviour weights, and the trainer's forward FP8-emulated too.",
            megatron="vLLM rollout with FP8 (e4m3) weights and an FP8 KV cache; the actor trains "
            "in FP8 on verl's Megatron engine (Transformer Engine, block-wise e4m3, FP32 router): "
            "the paper's FP8 end-to-end.",
            megatron_label="FP8 end-to-end (FP8 training, Megatron)",
            megatron_fp8=True,
        ),
    ]
}

# The precision names as a type, for the fields that hold one (Trial, the sim's trial config).
PrecisionName = Literal[tuple(PRECISIONS)]  # type: ignore[valid-type]

CLUSTERS: dict[str, ClusterProfile] = {
    c.name: c
    for c in [
        ClusterProfile(
            name="h20x32",
            nodes=4,
            gpus_per_node=8,
            gpu_kind="H20",
            gpu_memory_gb=96,
            # the paper's FP8 end-to-end trains in FP8: in verl 0.9.1 only its Megatron engine does
            megatron_precisions=("fp8-e2e",),
        ),
        ClusterProfile(name="h100x16", nodes=2, gpus_per_node=8, gpu_kind="H100", gpu_memory_gb=80),
        ClusterProfile(name="h200x8", nodes=1, gpus_per_node=8, gpu_kind="H200", gpu_memory_gb=141),
        ClusterProfile(
            name="this-machine",
            nodes=1,
            # two logical GPUs, one training process each: the smallest multi-rank shape
            # (qwen3-tiny-moe); a one-GPU trial takes one, so two such trials fit at once unless
            # the sweep's max_concurrent says otherwise (verl-smoke runs one at a time)
            gpus_per_node=2,
            gpu_kind="CPU",
            gpu_memory_gb=0,
            device="cpu",
            # measured 95-240 s from submission to the first step on 2 loaded cores
            job_startup_seconds=900.0,
        ),
    ]
}
"""Cluster profiles; `h20x32` is the paper's (4 nodes x 8 H20 96 GB); `this-machine` runs VeRL on
this machine's CPU cores (the tiny model only)."""


def training_engine(precision: str, cluster: str) -> TrainingEngine:
    """The one answer to which verl engine a setting's actor trains on: the cluster profile's
    `megatron_precisions` on Megatron, everything else on FSDP."""
    return "megatron" if precision in CLUSTERS[cluster].megatron_precisions else "fsdp"
