"""The failure kinds and an error's fingerprint (``tracking/runs.py``): what is deterministic by
kind, what a job's or a trial's failure line says, and what two attempts failing alike share."""

from __future__ import annotations

import pytest

from pdmask.tracking.runs import (
    DETERMINISTIC,
    FailureKind,
    attempt_kind,
    exception_kind,
    failure_headline,
    fingerprint,
)


@pytest.mark.parametrize(
    "line,kind",
    [
        ("ImportError: FlashAttention2 has been toggled on, but it cannot be used", "import"),
        ("ModuleNotFoundError: No module named 'flash_attn'", "import"),
        ("ray.exceptions.RayTaskError(ModuleNotFoundError): ray::TaskRunner.run()", "import"),
        ("pdmask.errors.ConfigError: delta must be > 0", "config"),
        ("omegaconf.errors.ConfigAttributeError: Key 'x' is not in struct", "config"),
        ("RecipeError: recipe recipes/x.py: mask: line 3: boom", "recipe"),
        ("RuntimeError: Engine core initialization failed. See root cause above.", "engine"),
        (
            "ray.exceptions.RayTaskError(RuntimeError): CUDA error: an illegal memory access",
            "crash",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory", "crash"),
        ("stalled: no step for 930 s", "crash"),
    ],
)
def test_the_kind_of_a_failure_line(line, kind):
    assert exception_kind(line) == kind


def test_deterministic_kinds_are_the_ones_retrying_cannot_fix():
    assert {k.value for k in DETERMINISTIC} == {"config", "recipe", "import", "engine", "repeated"}
    assert not any(
        FailureKind(k).deterministic for k in ("crash", "stall", "lost-node", "preempted", "signal")
    )


def test_a_fingerprint_leaves_out_what_differs_between_attempts():
    a = "RuntimeError: NCCL timeout after 600 s on rank 3 (run 9f2c1e7ab4d0, /tmp/ray/s_1/x.py:88) at 2026-12-06T10:31:07"
    b = "RuntimeError: NCCL timeout after 1800 s on rank 11 (run 0a1b2c3d4e5f, /scratch/j/x.py:91) at 2026-12-07 08:02:55.123"
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a).startswith("RuntimeError: NCCL timeout after <n> s on rank <n>")
    assert fingerprint(a) != fingerprint("ValueError: NCCL timeout after 600 s on rank 3")
    assert fingerprint(a) != fingerprint("RuntimeError: NCCL abort on rank 3")


def test_a_crash_is_repeated_only_after_an_earlier_crash_alike():
    earlier = [{"attempt": 1, "reason": "RuntimeError: boom at step 12", "kind": "crash"}]
    assert attempt_kind(FailureKind.CRASH, "RuntimeError: boom at step 40", earlier) == "repeated"
    assert attempt_kind(FailureKind.CRASH, "RuntimeError: bang", earlier) == "crash"
    stall = [{"attempt": 1, "reason": "RuntimeError: boom at step 12", "kind": "stall"}]
    assert attempt_kind(FailureKind.CRASH, "RuntimeError: boom at step 40", stall) == "crash"
    assert attempt_kind(FailureKind.STALL, "RuntimeError: boom at step 40", earlier) == "stall"


def test_the_line_that_names_a_jobs_error_is_its_last_exception():
    reason = "Ray job pdm-s-0123456789abcdef-a2 FAILED (exit code 1): failed; last exception: ImportError: x\n--- log tail ---\n..."
    assert failure_headline(reason) == "ImportError: x"
    assert (
        failure_headline("the job's watchdog: no step\nRay job ...")
        == "the job's watchdog: no step"
    )
