"""What each rank of ``test_megatron_hook.py``'s TP-2 group computes (not a test module): pdmask's
hook on vocabulary-parallel logits in verl's Megatron layouts against the FSDP hook on the full
logits of the same micro-batch. Results go to ``<folder>/rank<r>.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

RANKS = 2


def _compare(rank: int) -> dict:
    from megatron.core import parallel_state as mpu
    from verl.models.mcore.util import (
        postprocess_bshd_engine,
        postprocess_thd_engine,
        preprocess_bshd_engine,
        preprocess_thd_engine,
    )

    from pdmask.backends.verl.megatron_processor import megatron_statistics_outputs
    from pdmask.backends.verl.processor import StatsSettings, statistics_outputs
    from tests.verl.batches import make_batch, micro_batch, nested

    mpu.initialize_model_parallel(tensor_model_parallel_size=RANKS)
    batch = make_batch(vocab=64, k=5)
    indices = [0, 1, 2, 3]
    data = micro_batch(batch, indices)
    settings = StatsSettings(method="pdm-agg", topk=5, inputs=("entropy", "support_log_probs"))
    full = batch.sample_logits(indices).detach()
    want = statistics_outputs(full.unsqueeze(0), data, settings)
    input_ids = data["input_ids"]
    lengths = input_ids.offsets().diff().tolist()
    # each sequence's last row predicts past its end (the FSDP hook rolls over the packed batch)
    keep = torch.ones(sum(lengths), dtype=torch.bool)
    keep[torch.tensor(lengths).cumsum(0) - 1] = False
    width = batch.vocab // RANKS
    columns = slice(rank * width, (rank + 1) * width)
    rows = nested(list(full.split(lengths)))
    results = {}
    for name, fp8 in (("thd", False), ("thd-fp8-padding", True), ("bshd", False)):
        if name.startswith("thd"):
            logits = preprocess_thd_engine(rows, use_fp8_padding=fp8)[0]
            params = preprocess_thd_engine(input_ids, use_fp8_padding=fp8)[1]

            def back(v, params=params):
                return postprocess_thd_engine(v, params, input_ids, len(indices))
        else:
            logits, mask, _ = preprocess_bshd_engine(rows)

            def back(v, mask=mask):
                return postprocess_bshd_engine(v, mask)

        shard = logits[..., columns].contiguous()
        got = megatron_statistics_outputs(
            shard, data, settings, data_format=name[:4].rstrip("-"), fp8_padding=fp8
        )
        errors = {}
        for key, value in want.items():
            mine = back(got[key]).values()
            errors[key] = float((mine[keep].double() - value[0][keep].double()).abs().max())
        results[name] = {"rows": list(got[next(iter(got))].shape), "errors": errors}
    results["keys_equal"] = sorted(got) == sorted(want)
    return results


def run(rank: int, folder: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    store = dist.FileStore(str(Path(folder) / "store"), RANKS)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=RANKS)
    try:
        results = _compare(rank)
    finally:
        dist.destroy_process_group()
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(results))
