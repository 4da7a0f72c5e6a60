"""Kill -9 in the middle of a trial, rerun it: it resumes from the checkpoint, as if never killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pdmask.backends.sim.checkpoint import read_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.processes]

TRIAL = """
import json, os, sys, time
from pathlib import Path
from pdmask.backends.sim import SimTrialConfig, train_trial
from pdmask.registry import load_registry

workdir, cache, report_file, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
cfg = SimTrialConfig(stand_in="tiny-4b", precision="fp8-rollout", profile="smoke", seed=3,
                     delta=0.15, steps=10, checkpoint_every=3, cache_dir=cache)

def reporter(step, metrics):
    with open(report_file, "a") as f:
        f.write(json.dumps({"step": step, "metrics": metrics}) + "\\n")
        f.flush()
        os.fsync(f.fileno())
    time.sleep(pause)  # a slow tracking server: leaves time to kill the trial mid-run

pdm_agg = load_registry().recipes["pdm-agg"]
train_trial(cfg, mask_fn=pdm_agg.method(pdm_agg.resolve_params({"delta": 0.15})[0]),
            reporter=reporter, workdir=Path(workdir))
"""
TIMING = {"perf/tokens_per_s"}


def _start(workdir, cache, report, pause):
    return subprocess.Popen(
        [sys.executable, "-c", TRIAL, str(workdir), str(cache), str(report), str(pause)]
    )


def _reports(path):
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _strip(metrics):
    return {k: v for k, v in metrics.items() if k not in TIMING}


def test_kill_minus_9_then_rerun_resumes_from_the_checkpoint(tmp_path, sim_cache):
    killed_dir, clean_dir = tmp_path / "killed", tmp_path / "clean"
    first, second, clean = tmp_path / "first.jsonl", tmp_path / "second.jsonl", tmp_path / "c.jsonl"

    reference_run = _start(clean_dir, sim_cache, clean, pause=0)  # in parallel, never killed
    proc = _start(killed_dir, sim_cache, first, pause=0.5)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        steps = [r["step"] for r in _reports(first)]
        if steps and steps[-1] >= 5:  # past the step-3 checkpoint, before step 6's
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    assert proc.wait(timeout=60) == -signal.SIGKILL, "the trial was not killed mid-run"
    checkpoint = read_checkpoint(killed_dir / "checkpoint.pt")
    resumed_from = checkpoint["step"]
    reported_before_kill = [r["step"] for r in _reports(first)]
    assert 3 <= resumed_from < 10
    assert reported_before_kill[-1] > resumed_from  # some reported steps were lost with the kill

    assert _start(killed_dir, sim_cache, second, pause=0).wait(timeout=240) == 0
    assert reference_run.wait(timeout=240) == 0

    resumed = _reports(second)
    assert [r["step"] for r in resumed] == list(range(resumed_from + 1, 11))
    # Exactly what the uninterrupted trial reported for the same steps.
    reference = {r["step"]: _strip(r["metrics"]) for r in _reports(clean)}
    for r in resumed:
        assert _strip(r["metrics"]) == reference[r["step"]], r["step"]
    for r in _reports(first):
        assert _strip(r["metrics"]) == reference[r["step"]], r["step"]
