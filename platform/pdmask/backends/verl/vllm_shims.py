"""The small interceptions that make verl's vLLM server return the behaviour policy's top-K.

verl 0.9.1's ``vLLMHttpServer.generate`` hard-codes ``logprobs=0`` (only the sampled token's
log-prob) and keeps nothing else from vLLM's output. Rather than copying that long method, pdmask
wraps two names it looks up at call time in its module, active only inside a generate call that
pdmask's server subclass marked (a context variable, so concurrent requests do not mix):

- ``SamplingParams``: ``logprobs=0`` becomes ``logprobs=K``, and the request is marked (in
  ``extra_args``, which travels with it) so that vLLM's front end keeps the top-K as arrays;
- ``extract_prompt_logprobs`` (called with the finished ``RequestOutput`` and the request's
  ``extra_fields`` dict): additionally stores the decode-time top-K in ``extra_fields``, which
  verl passes to the agent loop untouched.

vLLM's front end (``LogprobsProcessor``) would turn each generated token's K+1 log-probs into a
dict of ``Logprob`` objects, each token's text decoded (~100 us per token at K = 20 on a CPU core,
in the serving process). For a marked request two more wraps keep the engine core's ``(n, K+1)``
arrays per step instead and build only what verl reads: the sampled token's ``Logprob`` per
position (column 0 of the arrays, with its rank), without its text, and the cumulative log-prob.
Decoding that one token's text per position, as ``logprobs=0`` does, was a third of the serving
process's time on the tiny model (py-spy); nothing of verl's reads it. Read in vLLM 0.24.0's
wheel and 0.31's CPU build: ``from_new_request``, ``_update_sample_logprobs`` and ``Logprob`` are
the same there; :func:`install_front_end` refuses to start if they moved.

Pure: no vllm import here (the wrapped originals are passed in), so it is tested on CPU.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable

from pdmask.backends.verl.vllm_topk import extract_decode_topk, rows_from_arrays
from pdmask.errors import BackendUnavailable

TOPK_IDS_FIELD = "pdm_topk_ids"
TOPK_LOGPROBS_FIELD = "pdm_topk_logprobs"
# SamplingParams.extra_args key marking a request whose top-K the front end keeps as arrays
ROWS_ARG = "pdm_topk_rows"

requested_topk: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pdmask_requested_topk", default=None
)
# Internal, for benchmarks/bench_rollout_topk.py's "before" only: True reads the top-K from
# vLLM's Logprob dicts (extract_decode_topk), the rollout's path before issue 44.
topk_from_dicts: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pdmask_topk_from_dicts", default=False
)


class TopKRows(list):
    """A marked request's sample log-probs in vLLM: the sampled token's dict per position (what
    verl reads, filled by :func:`front_end_patches`) plus ``steps``, the engine core's arrays per
    step."""

    def __init__(self):
        super().__init__()
        self.steps: list[tuple] = []


def sampling_params_factory(original: Callable) -> Callable:
    """``SamplingParams`` that asks for K log-probs when the current request wants the top-K."""

    def make(*args, **kwargs):
        k = requested_topk.get()
        if k and kwargs.get("logprobs") == 0:
            kwargs["logprobs"] = k
            if not topk_from_dicts.get():
                kwargs["extra_args"] = {**(kwargs.get("extra_args") or {}), ROWS_ARG: k}
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
            if isinstance(completion.logprobs, TopKRows):
                ids, lps = rows_from_arrays(completion.token_ids, completion.logprobs.steps, k)
            else:
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


def front_end_patches(
    from_new_request: Callable, update_sample_logprobs: Callable, logprob_cls: type
):
    """Wrapped ``LogprobsProcessor.from_new_request`` and ``_update_sample_logprobs``: a marked
    request's processor fills a :class:`TopKRows` with the sampled token's ``logprob_cls`` per
    position and keeps the arrays; vLLM's own update runs for every other request."""

    def new_request(cls, tokenizer, request):
        processor = from_new_request(tokenizer, request)
        extra = request.sampling_params.extra_args or {}
        if extra.get(ROWS_ARG) and processor.logprobs is not None:
            processor.logprobs = TopKRows()
            processor.num_logprobs = 0  # what verl's logprobs=0 asks for: the sampled token
        return processor

    def update(self, logprobs_lists):
        rows = self.logprobs
        if not isinstance(rows, TopKRows):
            return update_sample_logprobs(self, logprobs_lists)
        ids, lps = logprobs_lists.logprob_token_ids, logprobs_lists.logprobs
        rows.steps.append((ids, lps))
        sampled = zip(  # the engine puts the sampled token in column 0
            ids[:, 0].tolist(),
            lps[:, 0].tolist(),
            logprobs_lists.sampled_token_ranks.tolist(),
            strict=True,
        )
        for token_id, logprob, rank in sampled:
            self.cumulative_logprob += logprob
            rows.append({token_id: logprob_cls(logprob=logprob, rank=rank, decoded_token=None)})
        return None

    new_request.pdmask_wrapped = from_new_request
    update.pdmask_wrapped = update_sample_logprobs
    return classmethod(new_request), update


def install_front_end(processor_cls, lists_cls, sampling_params_cls, logprob_cls) -> None:
    """Wrap vLLM's ``LogprobsProcessor`` (idempotent); refuses, naming each, if the internals this
    relies on moved (a newer vLLM must be read again, not silently run on the dict path)."""
    if hasattr(processor_cls._update_sample_logprobs, "pdmask_wrapped"):
        return
    moved = []
    if list(inspect.signature(processor_cls.from_new_request).parameters) != [
        "tokenizer",
        "request",
    ]:
        moved.append("LogprobsProcessor.from_new_request(tokenizer, request)")
    update = getattr(processor_cls, "_update_sample_logprobs", None)
    if update is None or list(inspect.signature(update).parameters) != ["self", "logprobs_lists"]:
        moved.append("LogprobsProcessor._update_sample_logprobs(self, logprobs_lists)")
    fields = set(getattr(lists_cls, "_fields", ()))
    if not {"logprob_token_ids", "logprobs", "sampled_token_ranks"} <= fields:
        moved.append("LogprobsLists(logprob_token_ids, logprobs, sampled_token_ranks)")
    if "extra_args" not in getattr(sampling_params_cls, "__annotations__", {}):
        moved.append("SamplingParams.extra_args")
    if not {"logprob", "rank", "decoded_token"} <= set(getattr(logprob_cls, "__annotations__", {})):
        moved.append("Logprob(logprob, rank, decoded_token)")
    if moved:
        raise BackendUnavailable(
            "vLLM's front end moved; pdmask's top-K arrays rely on: " + ", ".join(moved)
        )
    new_request, wrapped_update = front_end_patches(
        processor_cls.from_new_request, update, logprob_cls
    )
    processor_cls.from_new_request = new_request
    processor_cls._update_sample_logprobs = wrapped_update
