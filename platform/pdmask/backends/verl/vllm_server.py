"""pdmask's vLLM server and replica: verl's, plus the decode-time top-K when the rollout asks.

Imported only where a vLLM replica is created (the plugin registers ``_load_topk_vllm`` as verl's
``vllm`` replica loader) and in the server actors, so vllm is never imported elsewhere. The server
behaves like verl's, with three additions:

- the decode-time top-K, when ``actor_rollout_ref.rollout.custom.pdm_topk`` is set and the request
  asks for log-probs, taken from vLLM's arrays in its front end (``vllm_shims``);
- pdmask's worker extension (``vllm_worker.py``) in vLLM's workers instead of verl's: on CPU it
  keeps the linear weights loadable, so weight syncs work on every CPU's GEMM path;
- ``engine_error()``: why its vLLM engine is dead (None while it lives), for the job's watchdog
  (``watchdog.py``). An engine that dies in the middle of a weight sync leaves verl's trainer
  waiting for the receiver forever; the watchdog asks every server and ends the job.
"""

from __future__ import annotations

import ray
from verl.workers.rollout.vllm_rollout import vllm_async_server
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from vllm.logprobs import Logprob
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.logprobs import LogprobsProcessor
from vllm.v1.outputs import LogprobsLists

from pdmask.backends.verl import compat, vllm_shims
from pdmask.backends.verl.vllm_worker import WORKER_EXTENSION
from pdmask.errors import BackendUnavailable

compat.check_version()
_missing = compat.vllm_server_missing_names()
if _missing:
    raise BackendUnavailable("verl hooks used by pdmask are missing: " + ", ".join(_missing))
vllm_shims.install(vllm_async_server)
vllm_shims.install_front_end(LogprobsProcessor, LogprobsLists, SamplingParams, Logprob)


def topk_setting(config) -> int | None:
    """K from the rollout config's ``custom.pdm_topk`` (None: plain verl behaviour)."""
    custom = getattr(config, "custom", None) or {}
    k = custom.get("pdm_topk")
    return int(k) if k else None


class TopKvLLMHttpServer(vLLMHttpServer):
    _pdm_engine_error: str | None = None

    def _get_worker_extension_cls(self) -> str:
        return WORKER_EXTENSION

    def engine_error(self) -> str | None:
        """Why this server's vLLM engine is dead; None while it lives (or on a headless node)."""
        if self._pdm_engine_error:
            return self._pdm_engine_error
        engine = getattr(self, "engine", None)
        if engine is not None and getattr(engine, "errored", False):
            return "vLLM's engine core is dead (EngineDeadError; its traceback is in the job log)"
        return None

    async def collective_rpc(self, method, *args, **kwargs):
        # verl's weight sync runs in vLLM's workers through here: the worker's own exception
        # (not only "engine dead") is what the run's failure reason should name.
        try:
            return await super().collective_rpc(method, *args, **kwargs)
        except Exception as err:
            name = method if isinstance(method, str) else getattr(method, "__name__", "?")
            self._pdm_engine_error = f"vLLM worker call {name} failed: {type(err).__name__}: {err}"
            raise

    async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        k = topk_setting(self.config)
        if not k or not sampling_params.get("logprobs"):
            return await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
        if getattr(self, "_disaggregation_role", None) == "prefill":
            raise NotImplementedError(
                "pdmask's decode-time top-K does not support prefill/decode disaggregation"
            )
        token = vllm_shims.requested_topk.set(k)
        try:
            return await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
        finally:
            vllm_shims.requested_topk.reset(token)


class TopKvLLMReplica(vLLMReplica):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(TopKvLLMHttpServer)
