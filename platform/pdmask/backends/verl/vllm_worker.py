"""pdmask's vLLM worker extension: verl's, plus loadable CPU linear weights (``vllm_cpu_gemm``).

vLLM imports a worker extension class by its qualified name in every worker process when the
worker is created, before the model is loaded; pdmask's vLLM server names this one instead of
verl's (``vllm_server.TopKvLLMHttpServer``). Importing this module installs the CPU fix where
vLLM runs on CPU and does nothing on GPUs; the class adds nothing to verl's.
"""

from __future__ import annotations

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from pdmask.backends.verl.vllm_cpu_gemm import keep_loadable_weights

WORKER_EXTENSION = f"{__name__}.PdmWorkerExtension"

keep_loadable_weights()


class PdmWorkerExtension(vLLMColocateWorkerExtension):
    """verl's colocated worker extension, loaded through this module (see the docstring)."""
