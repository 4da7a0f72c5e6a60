"""Two tensor-parallel ranks on one device: the process group the ``shard`` and ``megatron`` parts
run in.

Two processes share the device (on a GPU both on device 0) in a gloo group over loopback: NCCL
refuses two ranks on one GPU, and gloo takes CUDA tensors, staging them through host memory. So
the collectives are real and their results exact, but neither their speed nor the two ranks'
kernels, sharing one GPU's multiprocessors, is what two GPUs with NCCL would show.

The ranks are spawned once for both parts (each process imports torch, Triton, pdmask and, for
``megatron``, verl and Megatron-Core: seconds), run the parts asked for in order, each in its own
try block, and write ``<folder>/rank<r>.json``; ``TwoRanks.part`` combines the ranks' records of a
part (``shard_pass.combine``, ``megatron_hook.combine``) or raises with the first rank's error.
"""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

RANKS = 2
PARTS = ("shard", "megatron")  # the check's parts that run here, in this order
TIMEOUT_S = {True: 120, False: 600}  # a collective's wait: tiny, full


def _module(part: str):
    from . import megatron_hook, shard_pass

    return {"shard": shard_pass, "megatron": megatron_hook}[part]


def _rank(rank: int, folder: str, device: str, tiny: bool, repeats: int, parts: list[str]):
    """One rank: the process group, then each part (its record, or its error)."""
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's transport on loopback only
    if device == "cuda":
        torch.cuda.set_device(0)  # both ranks on the one GPU
    else:
        torch.set_num_threads(1)  # two ranks on a CPU machine's cores
    store = dist.FileStore(str(Path(folder) / "store"), RANKS)
    timeout = timedelta(seconds=TIMEOUT_S[tiny])
    dist.init_process_group("gloo", store=store, rank=rank, world_size=RANKS, timeout=timeout)
    records = {}
    try:
        for part in parts:
            try:
                record = _module(part).run_rank(rank, torch.device(device), tiny, repeats)
                records[part] = {"ok": True, **record}
            except Exception as err:  # recorded; the next part still runs
                records[part] = {
                    "ok": False,
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc(limit=-8),
                }
    finally:
        dist.destroy_process_group()
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(records, default=str))


class TwoRanks:
    """The two ranks of one check, spawned at the first part asked of them."""

    def __init__(self, device, tiny: bool, repeats: int, parts) -> None:
        self.args = (str(device.type), tiny, repeats, [p for p in PARTS if p in parts])
        self.records: list[dict] | Exception | None = None  # an Exception: the spawn failed

    def _spawn(self) -> list[dict]:
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory(prefix="pdm-tp-ranks-") as folder:
            mp.spawn(_rank, args=(folder, *self.args), nprocs=RANKS, join=True)
            return [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(RANKS)]

    def part(self, name: str) -> dict:
        """The part's record over both ranks; raises with a rank's error where one failed."""
        if self.records is None:
            try:
                self.records = self._spawn()
            except Exception as err:  # a rank died: every part of theirs fails, none respawns
                self.records = err
        if isinstance(self.records, Exception):
            raise RuntimeError(f"the two ranks did not finish: {self.records}") from self.records
        per_rank = [records[name] for records in self.records]
        for rank, record in enumerate(per_rank):
            if not record["ok"]:
                raise RuntimeError(f"rank {rank}: {record['error']}\n{record['traceback']}")
        return {"ranks": RANKS, "collectives": "gloo", **_module(name).combine(per_rank)}
