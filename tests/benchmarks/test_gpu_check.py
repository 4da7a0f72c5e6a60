"""The prepared GPU check runs, whole, on CPU at tiny sizes: it cannot rot before a GPU is lent.

One run of ``benchmarks/gpu_check.py --device cpu --tiny`` (the README's code check) feeds the
assertions on every part; the fused Triton kernel runs in Triton's interpreter and is held to a
float64 reference; the tensor-parallel parts run two real ranks over gloo (the pass's shards at
tiny size on the chunks, Megatron-Core's groups, verl's Megatron layouts). A second, in-process
run shows that one part's failure costs no other part.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.processes]

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "VERL_PLATFORM")}
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--device", "cpu", "--tiny", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    records = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]
    return proc, {r["part"]: r for r in records}, records


def test_every_part_reports_one_ok_json_line(tiny_run):
    proc, parts, records = tiny_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["part"] for r in records] == [
        "environment",
        "loss",
        "hook",
        "engine",
        "profile",
        "shard",
        "megatron",
    ]
    assert all(r["ok"] for r in records), [r.get("error") for r in records]
    stdout = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert stdout == records  # stdout holds the same lines, and nothing else parses as JSON


def test_loss_part_times_every_path_and_checks_verls_against_float64(tiny_run):
    _, parts, _ = tiny_run
    loss = parts["loss"]
    expected = {"torch-ce", "verl-fused", "verl-fallback", "pdm-agg", "pdm-uni", "dppo-topk-kl"}
    expected |= {"ent-bonus"}
    assert set(loss["paths"]) == expected | {"pdm-agg-chunked"}
    assert loss["pdm_pass"] == "chunked"  # on CPU; a GPU with Triton runs the fused pass
    # the pass as it ran, against itself in float64 (float32 math, a bf16 gradient)
    for label, vs64 in loss["pdm_pass_vs_float64"].items():
        assert vs64["logp_sampled_abs"] < 1e-4 and vs64["logp_support_abs"] < 1e-4, label
        tails = ("tail_mass_rel", "tail_sum_sq_rel", "tail_sum_cube_rel")
        assert max(vs64[k] for k in tails) < 1e-4, label
        assert vs64["grad_row_relative"] <= torch_bf16_eps() * 1.01, label
    assert loss["pdm_pass_vs_float64"]["sampled"]["grad_bf16_spacings"] <= 1.0 + 1e-3
    assert loss["pdm_pass_vs_float64"]["all"]["entropy_abs"] < 1e-4
    assert all(p["ms"] > 0 for p in loss["paths"].values())
    assert loss["fused_kernel"] == "ran"
    # float32 log-sum-exp over 1,024 bf16 logits: errors of order 1e-6
    assert loss["logprob_max_abs_err"]["verl-fused"] < 1e-4
    # one rounding of a float32 value to bf16: <= 0.5 spacing rounding to nearest (GPU), <= 1
    # truncating (Triton's CPU interpreter)
    assert loss["fused_grad_max_bf16_spacings"] <= 1.0 + 1e-3
    # verl's fallback takes log-softmax in bf16 itself: worse, but still a log-prob
    assert loss["logprob_max_abs_err"]["verl-fallback"] < 0.2
    sweep = {int(k) for k in loss["chunk_sweep"]}
    assert loss["chunk_default_rows"] in sweep and loss["chunk_fastest_rows"] in sweep
    assert {1, 8, 64} <= sweep


def torch_bf16_eps() -> float:
    return 2.0**-7  # bf16 keeps 8 significant bits: one spacing is at most 2**-7 of a value


def test_hook_part_produces_pdmask_statistics(tiny_run):
    _, parts, _ = tiny_run
    hook = parts["hook"]
    assert hook["stat_outputs"] > 0
    assert hook["verl_ms"] > 0 and hook["pdmask_ms"] > 0
    assert hook["verl_logprobs"] == "flash-attn branch (fused_logprob)"


def test_engine_part_trains_two_steps_through_verls_fsdp_engine(tiny_run):
    _, parts, _ = tiny_run
    engine = parts["engine"]
    assert engine["params"] > 0 and engine["micro_batches"] == 2
    assert len(engine["steps"]) == 2
    for step in engine["steps"]:
        assert math.isfinite(step["loss"]) and step["loss"] != 0.0
        assert math.isfinite(step["grad_norm"]) and step["grad_norm"] > 0  # it trained
        assert 0.0 <= step["masked_frac"] <= 1.0
    # the masked share verl reports as its clip fraction is the recipe's mask
    assert engine["steps"][-1]["pg_clipfrac"] == engine["steps"][-1]["masked_frac"]


def test_profile_part_names_the_kernels_of_both_paths(tiny_run):
    _, parts, _ = tiny_run
    for name, prof in parts["profile"]["profiles"].items():
        assert prof["top"] and prof["kernels_launched"] >= len(prof["top"]), name
        assert sum(k["ms"] for k in prof["top"]) <= prof["total_ms"] + 1e-3, name
    # pdm-agg's chunked pass launches more than torch's one fused cross-entropy
    profiles = parts["profile"]["profiles"]
    assert profiles["pdm-agg"]["kernels_launched"] > profiles["torch-ce"]["kernels_launched"]


def test_shard_part_holds_every_output_and_gradient_of_two_shards_to_the_full_pass(tiny_run):
    """Two ranks, each its half of the vocabulary: every output and each rank's gradient columns
    within the float64 bounds the part states (twice that against the full pass, itself within
    its bound), the outputs the same bits on both ranks, and the three times measured."""
    _, parts, _ = tiny_run
    shard = parts["shard"]
    assert (shard["ranks"], shard["collectives"]) == (2, "gloo")
    assert shard["columns"] == [[0, 512], [512, 512]]
    assert shard["engine"] == "chunked"  # CPU at 512 columns; a GPU runs the fused kernels
    bounds = shard["bounds"]
    assert set(bounds) == {
        "logp_sampled", "logp_support", "entropy", "tail_mass", "tail_sum_sq", "tail_sum_cube",
        "grad_row_relative",
    }  # fmt: skip
    for errors, factor in (
        (shard["vs_float64"]["shard"], 1),
        (shard["vs_float64"]["full"], 1),
        (shard["vs_full_pass"], 2),
    ):
        for key, bound in bounds.items():
            assert 0 <= errors[key] <= factor * bound, (key, errors, bounds)
    assert shard["matches"] and shard["replicated"]
    assert min(shard["full_ms"], shard["tp2_ms"], shard["allreduce_ms"]) > 0
    assert shard["tp2/full"] == round(shard["tp2_ms"] / shard["full_ms"], 3)


def test_megatron_part_makes_a_tp2_group_and_its_hook_equals_the_fsdp_hook(tiny_run):
    _, parts, _ = tiny_run
    megatron = parts["megatron"]
    assert [g["tensor_parallel_rank"] for g in megatron["groups"]] == [0, 1]
    for group in megatron["groups"]:
        assert group["tensor_parallel"] == 2 and group["tensor_parallel_ranks"] == [0, 1]
        assert group["data_parallel"] == group["context_parallel"] == 1
    layouts = megatron["layouts"]
    assert set(layouts) == {"thd", "thd-fp8-padding", "bshd"}
    for name, layout in layouts.items():
        assert layout["same_statistics"], name
        assert layout["max_difference"] <= megatron["tolerance"] == 1e-4, (name, layout)
    # 4 sequences of 9 tokens, each padded to a multiple of TP (10), or of 16 with FP8 padding
    assert layouts["thd"]["rows"] == [1, 40] and layouts["bshd"]["rows"] == [4, 10]
    assert layouts["thd-fp8-padding"]["rows"] != layouts["thd"]["rows"]
    assert {"pdm_stat_logp", "pdm_stat_entropy"} <= set(megatron["statistics"])
    assert megatron["matches"]


def test_the_fused_kernels_compile_for_the_lent_gpu():
    """Triton's interpreter (the tiny run) accepts code its compiler refuses: a plain global read
    in a kernel ran on CPU and failed to compile on the H200. The kernel is compiled here for
    Hopper (compute capability 9.0) through to machine code, without a GPU."""
    code = (
        "from gpu.fused_logprob import compile_for; import json; print(json.dumps(compile_for(90)))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "benchmarks",
        env={**env, "TRITON_DEFAULT_FP_FUSION": "1", "PYTHONPATH": str(ROOT / "platform")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    stages = json.loads(proc.stdout.splitlines()[-1])
    assert set(stages) == {"_forward"}  # its backward is pdmask's (tests/trust_region)
    assert all(kernel[-1] == "cubin" for kernel in stages.values()), stages


def test_a_failing_part_costs_no_other_part(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    import gpu_check
    from gpu import hook_memory, loss_paths

    def broken(*args, **kwargs):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(hook_memory, "run", broken)
    # this process imported triton long before the check could select its interpreter
    monkeypatch.setattr(loss_paths, "fused_kernel_status", lambda device: "not in this test")
    code = gpu_check.main(
        ["--device", "cpu", "--tiny", "--parts", "hook,loss", "--out", str(tmp_path)]
    )
    records = [json.loads(x) for x in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    assert code == 1
    assert [(r["part"], r["ok"]) for r in records] == [
        ("environment", True),
        ("hook", False),
        ("loss", True),
    ]
    assert "planted failure" in records[1]["error"]
    assert records[2]["fused_kernel"] == "skipped: not in this test"
    assert "verl-fused" not in records[2]["paths"]
