"""A real Hugging Face model folder, small: what the model-folder probe and verl's own model load
are tested on."""

from __future__ import annotations

from pathlib import Path


def tiny_model_folder(folder: Path, shard: str | None = None) -> Path:
    """A real Hugging Face folder: a 2-layer Qwen3 and a word-level tokenizer, written by
    transformers (``shard``: a ``max_shard_size``, giving an index and several shards)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    vocab = {f"t{i}": i for i in range(63)} | {"<unk>": 63}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<unk>", eos_token="<unk>"
    ).save_pretrained(folder)
    return folder
