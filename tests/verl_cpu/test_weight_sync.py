"""verl's weight sync into vLLM's CPU engine works on every GEMM path vLLM's dispatch can pick.

Which path vLLM 0.31 gives a linear layer depends on the CPU (zentorch on AMD Zen with zentorch,
sgl's packed GEMM with AMX tiles, oneDNN, plain torch); three of them used to drop the loadable
weight, so every VeRL job died at its first sync on AVX-512/AMX machines and passed on AVX2 ones
(``backends/verl/vllm_cpu_gemm.py``). Each path is forced here on whatever machine runs the
suite (``weight_sync_probe.py``: vLLM's own kernels where this CPU has them, a stand-in with the
same packing contract where it does not) and a real round trip runs through the engine: verl's
sender and receiver, old -> new -> old weights.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

PATHS = ("torch", "onednn", "sgl-packed", "zentorch")
# The engine runs in bf16 against a float32 reference: bf16 keeps 8 significant bits (relative
# rounding 2**-9), and the tiny model's logits reach |z| ~ 20, so one matmul's output rounding is
# ~0.04 nats and two layers plus the LM head a few times that (measured 0.06 on the model's own
# weights, 0.14 on the synced ones). Syncing the noise moves the log-probs by several nats.
BF16_LOGPROB_BOUND = 0.3


def _max_diff(engine: list[dict[str, float]], reference: list[list[float]]) -> float:
    return max(
        abs(lp - reference[i][int(token)])
        for i, row in enumerate(engine)
        for token, lp in row.items()
    )


@pytest.fixture(scope="module")
def setup_report() -> str:
    """What ``python -m pdmask.backends.verl.cpu_setup`` reports as this machine's GEMM paths."""
    from pdmask.backends.verl.cpu_setup import check

    problems, gemm = check()
    assert not problems, problems
    return gemm


@pytest.fixture(scope="module")
def machine_path(setup_report: str) -> str:
    return setup_report.split(" ", 1)[0]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", PATHS)
def test_synced_weights_reach_the_engine_on_every_gemm_path(
    path, tiny_cache: Path, tmp_path: Path, machine_path: str
):
    out = tmp_path / "sync.json"
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("weight_sync_probe.py")),
            str(tiny_cache / "model"),
            str(out),
            path,
        ],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=ROOT,
    )
    assert done.returncode == 0 and out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    print(f"{path}: kernels {record['kernels']}")
    assert "error" not in record, record["error"]
    assert record["engine_paths"] == [path], "the dispatch was not steered to the path"
    if path == machine_path:
        # this machine's own path runs its real kernels (vLLM's, or torch's on the torch path)
        assert not record["kernels"].startswith("stand-in"), record["kernels"]

    before_err = _max_diff(record["before"], record["old"])
    synced_new = _max_diff(record["synced"], record["new"])
    synced_old = _max_diff(record["synced"], record["old"])
    assert before_err < BF16_LOGPROB_BOUND
    assert synced_new < BF16_LOGPROB_BOUND, f"after the sync the engine is {synced_new} off"
    assert synced_old > 10 * synced_new, "the engine still computes with the old weights"
    # Syncing the old weights back restores the engine exactly: same kernels, same weights.
    assert record["back"] == record["before"]


def test_setup_reports_this_machines_gemm_path(setup_report: str):
    names = "|".join(re.escape(p) for p in PATHS)
    assert re.fullmatch(rf"({names}) \(bfloat16\), ({names}) \(float32\)", setup_report), (
        setup_report
    )
