"""Tiny Qwen3 models made here, never downloaded: what VeRL trains on CPU (``verl-smoke``,
``verl-shape``).

Built on first use and cached in the model cache (``<state>/cache/tiny/``,
``paths.model_cache_dir``), or ahead of time::

    python -m pdmask.backends.verl.tiny_model [NAME ...]   # prints each model's folder

Two models, named as in the registry's catalog (``registry/catalog.py``, ``built_here=True``):

- ``qwen3-tiny``: a dense Qwen3 (hidden 128, 2 layers, 4 query / 2 KV heads of width 32 -- a head
  size vLLM's CPU attention supports -- about 0.36 M parameters);
- ``qwen3-tiny-moe``: the same attention with Qwen3-MoE's sparse blocks in every layer, shaped
  like Qwen3-30B-A3B's at toy size (4 experts, top-2 routing with normalised weights, expert width
  64, about 0.36 M parameters, 0.26 M active). Transformers 5 holds the experts packed as 3-D
  ``gate_up_proj`` / ``down_proj``; verl unfuses them per expert for vLLM's Qwen3-MoE loader
  (``unfuse_moe_params``). The expert width is a multiple of 32 per tensor-parallel rank at TP 2,
  the alignment of vLLM's CPU fused-MoE kernel (a width it has to pad cannot take a weight sync).

Both share:

- a byte-level BPE tokenizer trained here with ``tokenizers`` on the task's own text
  (``tiny_task``), saved as a Hugging Face fast tokenizer with Qwen's ChatML template and special
  tokens;
- weights from a fixed seed, then a brief supervised warm-up on the task's answers, so that the
  model writes ``Answer: N`` and gets some but not all sums right. Sampled at temperature 1 the
  rewards of a group then differ, so GRPO's advantages are not all zero: a smoke run that trains
  something. (A random model never writes the answer format: every reward would be 0.)
- the task's parquet files, built once into their own folder.

Each cache key covers everything that shapes the result (the model's spec and the task's version):
change any of it and a new folder is built. A folder appears only when complete (built in a
temporary folder, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
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
DENSE = "qwen3-tiny"
MOE = "qwen3-tiny-moe"
_ATTENTION = {
    "vocab_size": 512,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
# Everything each built model depends on (with the task's version); its hash names the folder.
SPECS: dict[str, dict] = {
    DENSE: {
        "version": 3,
        "architecture": "qwen3",
        "tokenizer_vocab": 512,
        "config": {**_ATTENTION, "intermediate_size": 256},
        "seed": 0,
        "warmup_steps": 120,
        "warmup_lr": 1e-2,
    },
    MOE: {
        "version": 1,
        "architecture": "qwen3_moe",
        "tokenizer_vocab": 512,
        "config": {
            **_ATTENTION,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,  # as Qwen3-30B-A3B
            "moe_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        "seed": 0,
        # half the dense model's: its loss falls faster (0.51 at step 60, the dense one's 0.44 at
        # 120), and a model that gets most sums right leaves fewer groups with mixed rewards
        "warmup_steps": 60,
        "warmup_lr": 1e-2,
    },
}
SPEC = SPECS[DENSE]
MODEL_SUBDIR = "model"


def _spec(name: str) -> dict:
    if name not in SPECS:
        raise KeyError(f"no tiny model {name!r}; pdmask builds {sorted(SPECS)}")
    return SPECS[name]


def cache_key(name: str = DENSE) -> str:
    shaped_by = {"model": _spec(name), "task": tiny_task.VERSION}
    return hashlib.sha256(json.dumps(shaped_by, sort_keys=True).encode()).hexdigest()[:12]


def cache_folder(name: str = DENSE) -> Path:
    return model_cache_dir() / "tiny" / f"{name}-{cache_key(name)}"


def task_folder() -> Path:
    return model_cache_dir() / "tiny" / f"task-v{tiny_task.VERSION}"


def built_files(name: str = DENSE) -> dict[str, Path]:
    """``{"model": folder, "train": parquet, "val": parquet}`` (possibly not yet built)."""
    return {
        "model": cache_folder(name) / MODEL_SUBDIR,
        "train": task_folder() / tiny_task.TRAIN_FILE,
        "val": task_folder() / tiny_task.VAL_FILE,
    }


def _chat_prompt(prompt: str) -> str:
    return f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"


def _corpus() -> list[str]:
    return [_chat_prompt(p) + tiny_task.response_text(a) + IM_END for p, a in tiny_task.problems()]


def train_tokenizer(vocab: int = SPEC["tokenizer_vocab"]):
    """A byte-level BPE fast tokenizer trained on the task's text, with ChatML tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD)
    fast.add_special_tokens({"additional_special_tokens": [IM_START]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _warm_up(model, tokenizer, spec: dict, log) -> float:
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["warmup_lr"])
    model.train()
    loss = torch.tensor(float("nan"))
    steps = spec["warmup_steps"]
    for step in range(steps):
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % 20 == 0:
            log(f"  tiny model warm-up step {step + 1}/{steps}: loss {loss.item():.3f}")
    model.eval()
    return float(loss.item())


def _model_classes(architecture: str):
    """(config class, model class) of an architecture in ``SPECS``."""
    if architecture == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        return Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3Config, Qwen3ForCausalLM


def build(folder: Path, name: str = DENSE, log=print) -> dict:
    """The named model's tokenizer, config and weights into ``folder/model``; what was built."""
    import torch

    spec = _spec(name)
    tokenizer = train_tokenizer(spec["tokenizer_vocab"])
    if len(tokenizer) > spec["config"]["vocab_size"]:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens > vocab {spec['config']}")
    config_class, model_class = _model_classes(spec["architecture"])
    config = config_class(
        **spec["config"],
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(spec["seed"])
    model = model_class(config)
    final_loss = _warm_up(model, tokenizer, spec, log)
    out = folder / MODEL_SUBDIR
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    return {"name": name, "spec": spec, "warmup_final_loss": final_loss}


def _build_task(folder: Path) -> dict:
    files = tiny_task.write_parquet(folder)
    return {"task_version": tiny_task.VERSION, "files": sorted(p.name for p in files.values())}


def _build_once(folder: Path, make: Callable[[Path], dict], what: str, log) -> None:
    """``make(tmp)`` in a temporary folder, renamed to ``folder`` once complete with what it
    returned as ``build.json`` (another process's folder, finished first, is kept)."""
    if (folder / "build.json").exists():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    log(f"building {what} in {folder} (once)")
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        record = make(tmp)
        (tmp / "build.json").write_text(json.dumps(record, indent=2))
        try:
            tmp.rename(folder)
        except OSError:  # another process finished the same build first: keep theirs
            if not (folder / "build.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_built(name: str = DENSE, log=print) -> dict[str, Path]:
    """The cached model and the task's data, built first if absent (seconds to a minute on two
    cores)."""
    _build_once(task_folder(), _build_task, "the tiny task's data", log)
    _build_once(
        cache_folder(name), lambda tmp: build(tmp, name, log), f"the tiny model {name}", log
    )
    return built_files(name)


def main(argv: list[str] | None = None) -> int:
    names = (sys.argv[1:] if argv is None else argv) or [DENSE]
    for name in names:
        if name not in SPECS:
            print(f"unknown tiny model {name!r}; choose from {sorted(SPECS)}", file=sys.stderr)
            return 2
    for name in names:
        files = ensure_built(name, log=lambda m: print(m, file=sys.stderr))
        print(files["model"].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
