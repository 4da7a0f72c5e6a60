"""verl's weight sync into vLLM's CPU engine works on every GEMM path vLLM's dispatch can pick.

Which path vLLM 0.31 gives a linear layer depends on the CPU (zentorch on AMD Zen with zentorch,
sgl's packed GEMM with AMX tiles, oneDNN, plain torch); three of them used to drop the loadable
weight, so every VeRL job died at its first sync on AVX-512/AMX machines and passed on AVX2 ones
(``backends/verl/vllm_cpu_gemm.py``). Each path is forced here on whatever machine runs the
suite (``weight_sync_probe.py``: vLLM's own kernels where this CPU has them, a stand-in with the
same packing contract where it does not) and a real round trip runs through the engine: verl's
sender and receiver, old -> new -> old weights.

The same round trip runs a tiny Qwen3-MoE through an engine at tensor parallel 2: verl unfuses
the trainer's packed experts (``unfuse_moe_params``), each rank of the engine loads its half of
every expert, and vLLM's CPU fused-MoE kernel must repack what was loaded (it prepacks only once
on its own: ``vllm_cpu_gemm.repack_moe_experts``).
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
# The MoE probe runs in float32 (the rollout dtype aside, the sync and the repack are the same):
# against the float32 reference only the order of float32 sums differs (eps 1.2e-7, logits
# |z| ~ 20, a few layers: ~1e-5, measured 9e-6); a stale or unpacked expert moves log-probs by
# nats (measured 7.6 stale, 29 unpacked).
FP32_LOGPROB_BOUND = 1e-3


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


def _probe(model: Path, out: Path, *args: str) -> dict:
    """``weight_sync_probe.py`` in its own process; its record."""
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("weight_sync_probe.py")),
            str(model),
            str(out),
        ]
        + list(args),
        capture_output=True,
        text=True,
        timeout=540,
        cwd=ROOT,
    )
    assert done.returncode == 0 and out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert "error" not in record, record["error"]
    return record


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", PATHS)
def test_synced_weights_reach_the_engine_on_every_gemm_path(
    path, tiny_cache: Path, tmp_path: Path, machine_path: str
):
    record = _probe(tiny_cache / "model", tmp_path / "sync.json", path)
    print(f"{path}: kernels {record['kernels']}")
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


@pytest.mark.timeout(600)
def test_synced_moe_experts_reach_both_tensor_parallel_ranks(tiny_moe_cache: Path, tmp_path: Path):
    record = _probe(tiny_moe_cache / "model", tmp_path / "sync.json", "auto", "float32", "2")
    assert record["model_type"] == "qwen3_moe"
    before_err = _max_diff(record["before"], record["old"])
    synced_new = _max_diff(record["synced"], record["new"])
    synced_old = _max_diff(record["synced"], record["old"])
    print(f"MoE, TP 2: before {before_err:.2e}, synced {synced_new:.2e} (old: {synced_old:.2f})")
    assert before_err < FP32_LOGPROB_BOUND, f"the engine's own weights are {before_err} off"
    assert synced_new < FP32_LOGPROB_BOUND, f"after the sync the engine is {synced_new} off"
    assert synced_old > 1000 * FP32_LOGPROB_BOUND, "the engine still computes with the old weights"
    assert record["back"] == record["before"]


def test_setup_reports_this_machines_gemm_path(setup_report: str):
    names = "|".join(re.escape(p) for p in PATHS)
    assert re.fullmatch(rf"({names}) \(bfloat16\), ({names}) \(float32\)", setup_report), (
        setup_report
    )
