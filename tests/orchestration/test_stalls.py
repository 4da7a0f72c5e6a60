"""A Tune trial that stops reporting steps is failed by its watchdog, retried once, then FAILED.

The recipe trains two steps' worth of minibatches, then blocks forever in its mask (a deadlock
stand-in: ``time.sleep`` in C, which no exception can interrupt). Before the watchdog, the sweep
hung silently; now each attempt ends within its stall bound, the sweep says why, and the run keeps
the reasons.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.orchestration.conftest import pdm, sweep_runs, write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.processes]

STUCK = '''"""Trains a little, then blocks forever (a stand-in for a deadlock)."""

import time

import torch

from pdmask.registry import Recipe

CALLS = [0]


def stuck(batch):
    if batch.response_mask.shape[0] > 8:  # a training minibatch, not the validation batch
        CALLS[0] += 1
        if CALLS[0] > 4:  # after this process's first step
            time.sleep(10**6)
    return torch.zeros_like(batch.response_mask)


RECIPE = Recipe(
    name="stuck",
    display_name="Stuck",
    color="#990000",
    summary=__doc__.splitlines()[0],
    mask=stuck,
)
'''

SWEEP = """backend: sim
profile: smoke
seeds: 1
max_concurrent: 1
retries: 2
grid:
  method: [stuck]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.15]
"""

STALL_S = 3  # the floor; ten of the trial's own step intervals decide (about 10 s here)
STARTUP_S = 120  # a stuck first step would otherwise wait out the 900 s default
BOUND_S = 600  # three attempts, each ending within its bound, with room for a loaded machine


def test_a_stalled_trial_is_failed_retried_once_then_failed_for_good(project):
    (project / "recipes" / "stuck.py").write_text(STUCK)
    write_sweep(project, "stuck", SWEEP)
    bounds = {"PDM_STALL_SECONDS": str(STALL_S), "PDM_STARTUP_SECONDS": str(STARTUP_S)}
    started = time.monotonic()
    out = pdm(project, "sweep", "stuck", timeout=BOUND_S, env=bounds)
    took = time.monotonic() - started
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 1, text[-3000:]
    assert "stalled: no progress for" in text and "retrying from its checkpoint" in text
    assert "not retried again" in text
    (run,) = sweep_runs(project, "stuck")
    tags = run.data.tags
    assert run.info.status == "FAILED"
    assert tags["pdm.failure_kind"] == "stall"
    assert tags["pdm.stalls"] == "2" and tags["pdm.attempts"] == "3"
    reasons = [f["reason"] for f in json.loads(tags["pdm.failures"])]
    assert sum(r.startswith("stalled: no progress for") for r in reasons) == 2, reasons
    assert int(tags["pdm.last_step"]) >= 1  # it trained before it stalled
    assert "pdm.watchdog" not in tags  # read once by the sweep, for its progress line
    print(f"three attempts, two stalls: {took:.0f} s")
