"""Run vLLM's CPU build on the tiny model and record what it returns (for test_vllm_topk.py).

``python vllm_probe.py MODEL_DIR OUT.json K``: in its own process, because vLLM pins its threads
to a core and keeps engine state for the life of the process. Records, for sampled completions
of every task prompt at temperature 1 with ``logprobs=K``: prompt ids, generated ids and every
returned ``(token id, log-prob, rank)``; the same under ``top_p=0.5``; and whether a request for
more log-probs than the engine's cap (``max_logprobs=K``) is refused. Then, with pdmask's front-end
patches installed (``vllm_shims.install_front_end``), the plain completions once more, marked: the
``(G, K+1)`` rows pdmask takes from vLLM's arrays (``rows_from_arrays``).
"""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: starts in seconds


def _entries(position) -> list[list]:
    return [
        [int(tid), float(lp.logprob) if math.isfinite(lp.logprob) else "-inf", lp.rank]
        for tid, lp in position.items()
    ]


def _completions(outputs) -> list[dict]:
    return [
        {
            "prompt_ids": list(out.prompt_token_ids),
            "token_ids": list(c.token_ids),
            "logprobs": [_entries(p) for p in c.logprobs],
            "cumulative_logprob": c.cumulative_logprob,
        }
        for out in outputs
        for c in out.outputs
    ]


def _arrays(llm, prompts, params, k: int) -> list[dict]:
    """The same requests through pdmask's arrays path (same seed: the same samples)."""
    from vllm import SamplingParams
    from vllm.logprobs import Logprob
    from vllm.v1.engine.logprobs import LogprobsProcessor
    from vllm.v1.outputs import LogprobsLists

    from pdmask.backends.verl import vllm_shims
    from pdmask.backends.verl.vllm_topk import rows_from_arrays

    vllm_shims.install_front_end(LogprobsProcessor, LogprobsLists, SamplingParams, Logprob)
    marked = params.clone()
    marked.extra_args = {vllm_shims.ROWS_ARG: k}
    found = []
    for out in llm.generate(prompts, marked, use_tqdm=False):
        for c in out.outputs:
            ids, lps = rows_from_arrays(c.token_ids, c.logprobs.steps, k)
            found.append(
                {
                    "token_ids": list(c.token_ids),
                    "sampled_dicts": [_entries(p) for p in c.logprobs],  # what verl reads
                    "cumulative_logprob": c.cumulative_logprob,
                    "ids": ids.tolist(),
                    "logprobs": lps.tolist(),
                }
            )
    return found


def main() -> int:
    model, out_path, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from vllm import LLM, SamplingParams

    from pdmask.backends.verl import tiny_task
    from pdmask.backends.verl.cpu_profile import VLLM_CPU_KV_CACHE_BYTES

    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=VLLM_CPU_KV_CACHE_BYTES,
        max_model_len=64,
        max_logprobs=k,
        logprobs_mode="processed_logprobs",  # as verl starts it: after temperature / top-p
        seed=0,
    )
    tok = llm.get_tokenizer()
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p, _ in tiny_task.problems()
    ]
    plain = SamplingParams(
        n=2, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=8, logprobs=k, seed=0
    )
    nucleus = SamplingParams(n=1, temperature=1.0, top_p=0.5, max_tokens=8, logprobs=k, seed=0)
    # K = 1: the sampled token is often outside the top-K, which the peaked tiny model rarely
    # shows at K = 20 (both cases must be seen)
    single = SamplingParams(
        n=2, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=8, logprobs=1, seed=0
    )
    record = {
        "k": k,
        "plain": _completions(llm.generate(prompts, plain, use_tqdm=False)),
        "single": _completions(llm.generate(prompts, single, use_tqdm=False)),
        "top_p": _completions(llm.generate(prompts[:20], nucleus, use_tqdm=False)),
    }
    record["arrays"] = _arrays(llm, prompts, plain, k)
    try:
        llm.generate(prompts[:1], SamplingParams(max_tokens=2, logprobs=k + 1), use_tqdm=False)
        record["over_cap"] = "accepted"
    except Exception as err:  # vLLM's refusal of logprobs > max_logprobs
        record["over_cap"] = f"refused: {type(err).__name__}: {err}"
    with open(out_path, "w") as fh:
        json.dump(record, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
