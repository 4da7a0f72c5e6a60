"""Qwen3-shaped models built from a config, with random weights: no tokenizer, no download."""

from __future__ import annotations

from transformers import Qwen3Config

# Qwen3-0.6B's published shape (its config.json): the head is 151,936 x 1024, tied to the input
# embedding, so at this size the logits dominate memory as in the 4B-30B models.
QWEN3_0_6B = dict(
    vocab_size=151_936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40_960,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)


def qwen3_config(shape: dict, **changes) -> Qwen3Config:
    """A Qwen3 config; attention through torch's SDPA (the machine has no flash-attn)."""
    return Qwen3Config(**{**shape, **changes}, attn_implementation="sdpa")
