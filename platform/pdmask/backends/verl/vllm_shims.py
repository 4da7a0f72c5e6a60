"""The two small interceptions that make verl's vLLM server return the behaviour policy's top-K.

verl 0.9.1's ``vLLMHttpServer.generate`` hard-codes ``logprobs=0`` (only the sampled token's
log-prob) and keeps nothing else from vLLM's output. Rather than copying that long method, pdmask
wraps two names it looks up at call time in its module, active only inside a generate call that
pdmask's server subclass marked (a context variable, so concurrent requests do not mix):

- ``SamplingParams``: ``logprobs=0`` becomes ``logprobs=K``;
- ``extract_prompt_logprobs`` (called with the finished ``RequestOutput`` and the request's
  ``extra_fields`` dict): additionally stores the decode-time top-K in ``extra_fields``, which
  verl passes to the agent loop untouched.

Pure: no vllm import here (the wrapped originals are passed in), so it is tested on CPU.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

from pdmask.backends.verl.vllm_topk import extract_decode_topk

TOPK_IDS_FIELD = "pdm_topk_ids"
TOPK_LOGPROBS_FIELD = "pdm_topk_logprobs"

requested_topk: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pdmask_requested_topk", default=None
)


def sampling_params_factory(original: Callable) -> Callable:
    """``SamplingParams`` that asks for K log-probs when the current request wants the top-K."""

    def make(*args, **kwargs):
        k = requested_topk.get()
        if k and kwargs.get("logprobs") == 0:
            kwargs["logprobs"] = k
        return original(*args, **kwargs)

    make.pdmask_wrapped = original
    return make


def extract_with_topk(original: Callable) -> Callable:
    """``extract_prompt_logprobs`` that also stores the decode-time top-K of a marked request."""

    def extract(output, num_prompt_logprobs, result_dict):
        original(output, num_prompt_logprobs, result_dict)
        k = requested_topk.get()
        if k and output.outputs:
            completion = output.outputs[0]
            ids, lps = extract_decode_topk(completion.token_ids, completion.logprobs, k)
            result_dict[TOPK_IDS_FIELD] = ids
            result_dict[TOPK_LOGPROBS_FIELD] = lps

    extract.pdmask_wrapped = original
    return extract


def install(module) -> None:
    """Wrap the two names in verl's vLLM server module (idempotent)."""
    if not hasattr(module.SamplingParams, "pdmask_wrapped"):
        module.SamplingParams = sampling_params_factory(module.SamplingParams)
    if not hasattr(module.extract_prompt_logprobs, "pdmask_wrapped"):
        module.extract_prompt_logprobs = extract_with_topk(module.extract_prompt_logprobs)
