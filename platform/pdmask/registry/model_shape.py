"""A model's shapes, as its Hugging Face ``config.json`` states them, and what follows from them.

The engine rules (``engine_rules.py``: which tensor-parallel sizes vLLM accepts), the cost model
(``cost.py``: FLOPs per token, checkpoint bytes) and the catalog's parameter counts all read these
numbers, so each is written once, in the catalog entry of its model, with its source.

Parameter counts follow the Qwen3 / Qwen3-MoE layer layout (transformers' ``modeling_qwen3`` and
``modeling_qwen3_moe``): per layer q, k, v and o projections, q/k RMS norms of one head's width,
two layer norms, and either a gated MLP (gate, up, down) or a router plus ``num_experts`` gated
expert MLPs; the token embedding and, unless tied, the lm head.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ModelShape(BaseModel):
    """The architecture numbers of a decoder-only transformer (Qwen3 and Qwen3-MoE layout)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(gt=0, description="`hidden_size`.")
    num_layers: int = Field(gt=0, description="`num_hidden_layers`.")
    num_attention_heads: int = Field(gt=0, description="`num_attention_heads` (query heads).")
    num_kv_heads: int = Field(gt=0, description="`num_key_value_heads` (grouped-query attention).")
    head_dim: int = Field(gt=0, description="`head_dim`.")
    intermediate_size: int = Field(
        gt=0,
        description="`intermediate_size`: the dense MLP's width (unused when every layer "
        "is a MoE layer).",
    )
    vocab_size: int = Field(gt=0, description="`vocab_size`: rows of the embedding and lm head.")
    tie_word_embeddings: bool = Field(description="`tie_word_embeddings`: one matrix for both.")
    max_position_embeddings: int = Field(
        gt=0, description="`max_position_embeddings`: vLLM's max_model_len when verl sets none."
    )
    num_experts: int = Field(0, ge=0, description="`num_experts` (0: a dense model).")
    num_experts_per_tok: int = Field(
        0, ge=0, description="`num_experts_per_tok`: experts a token uses."
    )
    moe_intermediate_size: int = Field(
        0, ge=0, description="`moe_intermediate_size`: one expert's width."
    )
    source: str = Field(description="Where these numbers were read (cosmetic).")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def _attention_params(self) -> int:
        q = self.hidden_size * self.num_attention_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * self.hidden_size
        return q + kv + o + 2 * self.head_dim + 2 * self.hidden_size  # q/k norms, layer norms

    def _expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    def _embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def params_total(self) -> int:
        """Every parameter (what FSDP holds and a checkpoint saves)."""
        if self.is_moe:
            mlp = self.num_experts * self._expert_params() + self.hidden_size * self.num_experts
        else:
            mlp = 3 * self.hidden_size * self.intermediate_size
        layers = self.num_layers * (self._attention_params() + mlp)
        return layers + self._embedding_params() + self.hidden_size  # + the final norm

    def params_active(self) -> int:
        """Parameters one token passes through (a MoE layer uses ``num_experts_per_tok`` experts
        and its router): the N of the 2N / 6N FLOP rules."""
        if not self.is_moe:
            return self.params_total()
        mlp = self.num_experts_per_tok * self._expert_params() + self.hidden_size * self.num_experts
        layers = self.num_layers * (self._attention_params() + mlp)
        return layers + self._embedding_params() + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """KV-cache bytes one token takes on one of ``tp`` ranks: keys and values of every layer,
        ``ceil(kv heads / tp)`` heads per rank (vLLM replicates a KV head when tp > kv heads)."""
        heads_per_rank = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * heads_per_rank * self.head_dim * dtype_bytes
