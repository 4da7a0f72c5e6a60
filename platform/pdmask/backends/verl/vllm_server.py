"""pdmask's vLLM server and replica: verl's, plus the decode-time top-K when the rollout asks.

Imported only where a vLLM replica is created (the plugin registers ``_load_topk_vllm`` as verl's
``vllm`` replica loader) and in the server actors, so vllm is never imported elsewhere. The server
behaves exactly like verl's unless ``actor_rollout_ref.rollout.custom.pdm_topk`` is set and the
request asks for log-probs.
"""

from __future__ import annotations

import ray
from verl.workers.rollout.vllm_rollout import vllm_async_server
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from pdmask.backends.verl import compat, vllm_shims
from pdmask.errors import BackendUnavailable

compat.check_version()
_missing = compat.vllm_server_missing_names()
if _missing:
    raise BackendUnavailable("verl hooks used by pdmask are missing: " + ", ".join(_missing))
vllm_shims.install(vllm_async_server)


def topk_setting(config) -> int | None:
    """K from the rollout config's ``custom.pdm_topk`` (None: plain verl behaviour)."""
    custom = getattr(config, "custom", None) or {}
    k = custom.get("pdm_topk")
    return int(k) if k else None


class TopKvLLMHttpServer(vLLMHttpServer):
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
