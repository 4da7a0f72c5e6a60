"""The base model: cached per stand-in, built once even when trials start together."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdmask.backends.sim import prepare_base_model

pytestmark = pytest.mark.processes

BUILD = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
from pdmask.backends.sim import prepare_base_model
print("PATH", prepare_base_model("tiny-4b", cache_dir=sys.argv[1], quick=True))
"""


def test_concurrent_trials_build_the_base_model_once(tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    builds = sum(out.count("training the tiny-4b base model") for out in outputs)
    paths = {line for out in outputs for line in out.splitlines() if line.startswith("PATH")}
    assert builds == 1, outputs
    assert len(paths) == 1
    cached = prepare_base_model("tiny-4b", cache_dir=tmp_path, quick=True)
    assert f"PATH {cached}" in paths
    assert not list(tmp_path.glob("*.tmp"))  # atomic write left no partial file


def test_cached_models_are_reused_and_keyed_by_stand_in(tmp_path):
    first = prepare_base_model("tiny-4b", cache_dir=tmp_path, quick=True)
    stamp = first.stat().st_mtime_ns
    assert prepare_base_model("tiny-4b", cache_dir=tmp_path, quick=True) == first
    assert first.stat().st_mtime_ns == stamp  # reused, not rebuilt
    other = prepare_base_model("tiny-8b", cache_dir=tmp_path, quick=True)
    assert other != first and other.exists()
