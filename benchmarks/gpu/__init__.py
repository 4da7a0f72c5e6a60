"""The GPU check's parts (``benchmarks/gpu_check.py`` runs them; ``benchmarks/README.md`` says how).

- ``measure``: timing, peak memory and the copy-bandwidth floor, on CUDA or CPU;
- ``loss_paths``: part (a), the loss path at 16k tokens x 151,936 logits, every variant;
- ``hook_memory``: part (b), pdmask's logits hook inside verl's engine output path;
- ``engine_step``: part (c), one optimizer step through verl's FSDP engine;
- ``batches``: the synthetic packed micro-batches (b) and (c) feed verl;
- ``recipes``: the recipe files at the check's delta, as (a) and (c) use them;
- ``fused_logprob``: the fused log-prob kernel verl runs on GPU nodes (flash-attn's, rewritten);
- ``tp_ranks``: two tensor-parallel ranks on one device (gloo), spawned for parts (e) and (f);
- ``shard_pass``: part (e), the logits pass on vocabulary-parallel shards at TP 2;
- ``megatron_hook``: part (f), Megatron-Core's TP-2 group and pdmask's Megatron hook;
- ``prepare``, ``wheels.txt``, ``standins/``, ``standin_path``, ``import_check``: what travels to a
  machine with no package index, and what stands in for what cannot.
"""
