"""A tiny Qwen3 model made here, never downloaded: what VeRL trains in the ``verl-smoke`` sweep.

Built on first use and cached in the model cache (``<state>/cache/tiny/<key>/``, ``paths.model_cache_dir``), or ahead of time::

    python -m pdmask.backends.verl.tiny_model          # prints the folder

What it is:

- a byte-level BPE tokenizer trained here with ``tokenizers`` on the task's own text (``tiny_task``),
  saved as a Hugging Face fast tokenizer with Qwen's ChatML template and special tokens;
- a Qwen3-architecture config sized for two CPU cores (hidden 128, 2 layers, 4 query / 2 KV heads
  of width 32 -- a head size vLLM's CPU attention supports -- about 0.36 M parameters);
- weights from a fixed seed, then a brief supervised warm-up on the task's answers, so that the
  model writes ``Answer: N`` and gets some but not all sums right. Sampled at temperature 1 the
  rewards of a group then differ, so GRPO's advantages are not all zero: a smoke run that trains
  something. (A random model never writes the answer format: every reward would be 0.)

The cache key covers everything that shapes the result (``SPEC``): change any of it and a new
folder is built. A folder appears only when complete (built in a temporary folder, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from pdmask.backends.verl import tiny_task
from pdmask.paths import model_cache_dir

# Qwen's ChatML tokens: verl's agent loop handles Qwen3 turns by ``<|im_end|>`` (and a one-token
# newline), so the tiny model speaks ChatML like the real ones; a turn ends with ``<|im_end|>``.
PAD = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Everything the built model depends on; its hash names the cache folder.
SPEC = {
    "version": 2,
    "tokenizer_vocab": 512,
    "config": {
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
    },
    "seed": 0,
    "warmup_steps": 120,
    "warmup_lr": 1e-2,
}
MODEL_SUBDIR = "model"
DATA_SUBDIR = "data"


def cache_key() -> str:
    return hashlib.sha256(json.dumps(SPEC, sort_keys=True).encode()).hexdigest()[:12]


def cache_folder() -> Path:
    return model_cache_dir() / "tiny" / f"qwen3-tiny-{cache_key()}"


def built_files(folder: Path | None = None) -> dict[str, Path]:
    """``{"model": folder, "train": parquet, "val": parquet}`` of a (possibly not yet) built cache."""
    folder = folder or cache_folder()
    return {
        "model": folder / MODEL_SUBDIR,
        "train": folder / DATA_SUBDIR / tiny_task.TRAIN_FILE,
        "val": folder / DATA_SUBDIR / tiny_task.VAL_FILE,
    }


def _chat_prompt(prompt: str) -> str:
    return f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"


def _corpus() -> list[str]:
    return [_chat_prompt(p) + tiny_task.response_text(a) + IM_END for p, a in tiny_task.problems()]


def train_tokenizer():
    """A byte-level BPE fast tokenizer trained on the task's text, with ChatML tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SPEC["tokenizer_vocab"],
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD)
    fast.add_special_tokens({"additional_special_tokens": [IM_START]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _warm_up(model, tokenizer, log) -> float:
    """Brief supervised training on the answers (loss on the response tokens only)."""
    import torch

    rows = []
    for prompt, answer in tiny_task.problems():
        messages = [{"role": "user", "content": prompt}]
        p = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        p = tokenizer(p)["input_ids"]
        r = tokenizer(tiny_task.response_text(answer))["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p, r))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    attention = torch.zeros_like(ids)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
        attention[i, : len(p) + len(r)] = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=SPEC["warmup_lr"])
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(SPEC["warmup_steps"]):
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % 20 == 0:
            log(
                f"  tiny model warm-up step {step + 1}/{SPEC['warmup_steps']}: loss {loss.item():.3f}"
            )
    model.eval()
    return float(loss.item())


def build(folder: Path, log=print) -> dict[str, Path]:
    """Tokenizer, config, weights and the task's parquet files into ``folder``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    files = built_files(folder)
    tokenizer = train_tokenizer()
    if len(tokenizer) > SPEC["config"]["vocab_size"]:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens > vocab {SPEC['config']}")
    config = Qwen3Config(
        **SPEC["config"],
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(SPEC["seed"])
    model = Qwen3ForCausalLM(config)
    final_loss = _warm_up(model, tokenizer, log)
    model.save_pretrained(files["model"], safe_serialization=True)
    tokenizer.save_pretrained(files["model"])
    model.generation_config.save_pretrained(files["model"])
    tiny_task.write_parquet(files["train"].parent)
    (folder / "build.json").write_text(
        json.dumps({"spec": SPEC, "warmup_final_loss": final_loss}, indent=2)
    )
    return files


def ensure_built(log=print) -> dict[str, Path]:
    """The cached tiny model and data, built first if absent (a few seconds on two cores)."""
    folder = cache_folder()
    if (folder / "build.json").exists():
        return built_files(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the tiny Qwen3 model and task data in {folder} (once)")
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        build(tmp, log)
        try:
            tmp.rename(folder)
        except OSError:  # another process finished the same build first: keep theirs
            if not (folder / "build.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return built_files(folder)


def main() -> int:
    files = ensure_built(log=lambda m: print(m, file=sys.stderr))
    print(files["model"].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
