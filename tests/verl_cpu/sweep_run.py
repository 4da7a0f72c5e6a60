"""A real ``pdm sweep NAME --backend verl`` in a scratch project, and what its tests read.

``verl_sweep`` runs the command as the user would (its own process, this repository's recipes,
sweeps and dashboards copied into a temporary project, ``cpu_env``), so a module's one sweep can be
watched while it runs (``listening.ListenWatch``, fault injection) and read afterwards.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.conftest import pdm_cmd

from .conftest import ROOT, cpu_env


def scratch_project(tmp_path_factory, name: str) -> Path:
    """A temporary project with this repository's recipes, sweeps and dashboards."""
    project = tmp_path_factory.mktemp(name)
    for folder in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / folder, project / folder)
    return project


def history(client, run, key: str) -> list[tuple[int, float]]:
    """A run's metric as sorted (step, value) pairs."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


@dataclass
class RunningSweep:
    """A ``pdm sweep`` process of ``verl_sweep``."""

    project: Path
    proc: subprocess.Popen
    started: float = field(default_factory=time.time)

    @property
    def log(self) -> Path:
        return self.project / "pdm.log"

    def outcome(self, **more) -> dict:
        """What a module's tests read: project, exit code, output, seconds, and ``more``."""
        return {
            "project": self.project,
            "rc": self.proc.returncode,
            "out": self.log.read_text(),
            "seconds": time.time() - self.started,
            **more,
        }


@contextlib.contextmanager
def verl_sweep(project: Path, sweep: str, **env: str):
    """``pdm sweep SWEEP --backend verl`` running in ``project`` (its output in ``pdm.log``), with
    ``cpu_env`` plus ``env``, as a ``RunningSweep``; ended if it still runs when the block exits."""
    with open(project / "pdm.log", "w") as out:
        proc = subprocess.Popen(
            pdm_cmd("sweep", sweep, "--backend", "verl"),
            env=cpu_env(project, **env),
            cwd=project,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield RunningSweep(project, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)


def assert_loopback_only_and_head_stopped(watch, out: str) -> None:
    """What a sweep on its own local head must leave: nothing of it listened beyond loopback
    (``watch``, a ``listening.ListenWatch`` over the sweep), and its head is stopped (``out``,
    the sweep's output) with its dashboard's port closed."""
    from .listening import listening_now

    assert watch.samples > 10 and watch.seen, "the watch saw the sweep's servers"
    assert watch.beyond_loopback() == {}, watch.beyond_loopback()
    match = re.search(r"local Ray head on (http://127\.0\.0\.1:\d+)", out)
    assert match and "stopped the local Ray head" in out
    port = int(match.group(1).rsplit(":", 1)[1])
    assert not any(a.endswith(f":{port}") for a in listening_now()), "the head's dashboard is gone"
