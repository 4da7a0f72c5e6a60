"""The fused Triton logits pass (what a GPU runs), held to float64 and compiled for Hopper, here.

Without a GPU the kernels run in Triton's interpreter (``interpreted_triton_pass.py``, in a fresh
process: the interpreter is chosen when triton is imported), through the same autograd function a
GPU takes. They are also compiled for compute capability 9.0 through to machine code: the
interpreter accepts some code the compiler refuses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pdmask.trust_region.logits_pass import fused_kernels

from .fused_cases import assert_matches_float64, assert_second_order_matches_float64

HERE = Path(__file__).resolve().parent
PLATFORM = HERE.parents[1] / "platform"
EPS32 = torch.finfo(torch.float32).eps

pytest.importorskip("triton")
from pdmask.trust_region import triton_pass  # noqa: E402


def _python(code_or_script: list[str], interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(PLATFORM), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return subprocess.run(
        [sys.executable, *code_or_script], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def interpreted_cases():
    proc = _python([str(HERE / "interpreted_triton_pass.py")], interpret=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_fused_pass_equals_float64_forward_and_backward(interpreted_cases):
    cases = interpreted_cases["cases"]
    assert [c["n"] for c in cases] == [37, 9, 5, 0, 23, 23, 11, 13]
    for c in cases:
        assert_matches_float64(c)


def test_the_second_order_statistics_from_the_fused_pass_equal_float64(interpreted_cases):
    assert_second_order_matches_float64(interpreted_cases["second_order"])


def test_every_statistic_from_the_fused_kernel_equals_float64(interpreted_cases):
    """``triton_stats``'s kernel builds the support and computes every ``TokenStats`` field (every
    method's proximity and direction tests read these) within the low-precision bounds of
    ``test_stats.py`` (float32 arithmetic: ``rtol 2e-4, atol 2e-6`` of the float64 value), and
    the gradient of a loss on every differentiable output within one spacing of the logits'
    dtype plus float32 terms, as the pass's own cases."""
    cases = interpreted_cases["stats"]
    assert [(c["k"], c["topk"], c["dtype"]) for c in cases] == [
        (20, True, "torch.bfloat16"), (8, True, "torch.float32"), (5, False, "torch.float16")
    ]  # fmt: skip
    for c in cases:
        assert c["same_support"] and c["invalid_slots_at_minus_inf"], c
        assert c["errors"]["support_size"] == 0 and c["errors"]["token_id"] == 0, c
        for name, error in c["errors"].items():
            assert error <= 2e-6 + 2e-4 * c["scale"][name], (name, c)
        assert any(name.startswith("brute/") for name in c["errors"]), c
        assert c["support_log_prob_error"] <= 16 * EPS32 * (1 + c["lse_max"]), c
        float32_terms = 4 * (1 + c["z_max"] + c["lse_max"]) * EPS32
        assert c["grad_row_relative"] <= c["eps"] + 2 * float32_terms, c


def test_the_fused_statistics_take_one_kernel_each_way_and_read_nothing_back(interpreted_cases):
    """Per direction: one Triton launch and no torch op that launches a kernel; every
    ``item``/``bool``/``tolist``/``cpu``/``numpy`` inside the pass raised (none did)."""
    for run in interpreted_cases["launches"]:
        counts = run["counts"]
        assert counts["forward"] == {"triton": ["_token_stats"], "torch": []}, run
        assert counts["backward"] == {"triton": ["_backward"], "torch": []}, run
        assert run["grad"], run


def test_the_fused_statistics_read_an_id_beyond_the_logits_as_a_missing_slot(interpreted_cases):
    """The statistics are those of the slot marked missing (id -1), none NaN; such an id is
    refused where it enters, before the loss (``test_rollout_topk.py``)."""
    beyond = interpreted_cases["beyond_the_logits"]
    assert beyond["fields"] > 10 and not beyond["nan"], beyond
    assert beyond["largest_difference"] == 0.0, beyond


def test_the_fused_kernels_compile_for_hopper():
    code = (
        "import json; from pdmask.trust_region.triton_stats import compile_for; "
        "print(json.dumps(compile_for(90)))"
    )
    proc = _python(["-c", code], interpret=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    stages = json.loads(proc.stdout.splitlines()[-1])
    assert set(stages) == {"_forward", "_backward", "_token_stats"}
    assert all(kernel[-1] == "cubin" for kernel in stages.values()), stages


def test_the_chunked_pass_serves_what_the_triton_kernels_cannot():
    def logits(dtype=torch.bfloat16, cuda=True):  # what the rule reads of a tensor
        return SimpleNamespace(is_cuda=cuda, dtype=dtype)

    assert fused_kernels(logits(), None) is triton_pass
    assert fused_kernels(logits(torch.float32), None) is triton_pass
    assert fused_kernels(logits(torch.float64), None) is None  # float64 math stays float64
    assert fused_kernels(logits(), 64) is None  # a chunk size asks for chunks
    assert (
        fused_kernels(torch.zeros(2, 8, dtype=torch.bfloat16), None) is None
    )  # a CPU's small vocabulary
