"""The job's sized collective timeout reaches the process group verl 0.9.1's engine workers create
(verl reads no ``nccl_timeout``): the plugin wraps ``initialize_global_process_group_ray``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.processes

PROBE = """
import torch, torch.distributed as dist
import verl.workers.engine_workers as workers
workers.initialize_global_process_group_ray(timeout_second=None, backend="cpu:gloo")
group = dist.distributed_c10d._get_default_group()
print(int(group._get_backend(torch.device("cpu")).options._timeout.total_seconds()))
dist.destroy_process_group()
"""


def _timeout(extra_env: dict[str, str]) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        VERL_USE_EXTERNAL_MODULES="pdmask.backends.verl.plugin",
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **extra_env,
    )
    env.pop("PDM_COLLECTIVE_TIMEOUT_S", None) if not extra_env else None
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.strip().splitlines()[-1])


def test_the_process_group_gets_the_jobs_timeout_and_torchs_default_without_one():
    assert _timeout({"PDM_COLLECTIVE_TIMEOUT_S": "4321"}) == 4321
    assert _timeout({}) == 1800  # torch's default_pg_timeout: what verl 0.9.1 leaves
