"""A trial whose worker dies without a signal to the sweep is a failure with its cause, never an
interrupt (``orchestration/tune/deaths.py``).

Real deaths in real embedded sweeps: a recipe that calls ``os._exit(0)`` after its first training
step, and one that allocates until the kernel's OOM killer ends it inside a memory-limited cgroup
(where the machine lets the test make one). Each death is recorded on the trial's run with its
cause; the same death twice is REPEATED and not retried again though retries are left; the run
is FAILED, the summary names the death, and the sweep exits 1, not 130.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdmask.orchestration.tune.deaths import death_of, is_worker_death, last_failure, oom_kills
from pdmask.tracking.runs import FailureKind
from tests.orchestration.conftest import env_for, sweep_runs, write_sweep

RECIPE = '''"""Trains one step, then {does}."""

import os

import torch

from pdmask.registry import Recipe

CALLS = [0]


def mask(batch):
    if batch.response_mask.shape[0] > 8:  # a training minibatch, not the validation batch
        CALLS[0] += 1
        if CALLS[0] > 4:  # after this process's first step
            {death}
    return torch.zeros_like(batch.response_mask)


RECIPE = Recipe(
    name="{name}",
    display_name="{name}",
    color="#990000",
    summary=__doc__.splitlines()[0],
    mask=mask,
)
'''
EXITS = RECIPE.format(name="exits", does="exits its process", death="os._exit(0)")
HOGS = RECIPE.format(
    name="hogs",
    does="allocates until it is killed",
    death="hog = [b'x' * (64 << 20) for _ in range(10**6)]",  # touched pages: real memory
)

SWEEP = """backend: sim
profile: smoke
seeds: 1
max_concurrent: 1
retries: 3
grid:
  method: [{method}]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.15]
"""
MEMORY_LIMIT = 5 << 30  # Ray, the driver and a sim worker fit; the hog does not
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def _sweep(project: Path, method: str, recipe: str, cgroup: Path | None = None):
    (project / "recipes" / f"{method}.py").write_text(recipe)
    write_sweep(project, method, SWEEP.format(method=method))
    enter = None
    if cgroup is not None:

        def enter() -> None:  # the sweep and everything it starts live in the cgroup
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run(
        [sys.executable, "-m", "pdmask", "sweep", method],
        capture_output=True,
        text=True,
        env=env_for(project),
        cwd=project,
        timeout=600,
        preexec_fn=enter,
    )


def _assert_died_twice_then_gave_up(project: Path, method: str, out, kind: str, cause: str):
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 1, text[-3000:]  # a failure, not an interrupt (130)
    summary = text.split(f"sweep {method}: summary")[-1]
    assert re.search(r"\bfailed 1\b", summary), summary[:1500]
    assert re.search(r"interrupted \(resume: run again\) 0\b", summary), summary[:1500]
    (run,) = sweep_runs(project, method)
    tags = run.data.tags
    assert run.info.status == "FAILED"
    assert tags["pdm.failure_kind"] == "repeated"
    failures = json.loads(tags["pdm.failures"])
    assert [f["kind"] for f in failures] == [kind, "repeated"], failures
    assert all(f["reason"].startswith(cause) for f in failures), failures
    assert tags["pdm.attempts"] == "2"  # retries were left: the third attempt gave up at once
    assert f"failed {run.data.tags['mlflow.runName']}: {cause}" in text, text[-2000:]
    assert "not retried again" in text
    assert int(tags["pdm.last_step"]) >= 1  # it trained before it died
    # Ray's own "(raylet) A worker died ..." lines, in colour codes, stay off the piped console:
    # the event line above names the death; theirs go to the driver log (driver_logs.py)
    assert "A worker died" not in text and "\x1b[" not in out.stdout + out.stderr, text[-2000:]
    driver_log = (project / ".pdm" / "logs" / method / "driver.log").read_text()
    assert "(raylet) A worker died" in driver_log and "\x1b[" not in driver_log


@pytest.mark.slow
@pytest.mark.processes
def test_a_worker_that_exits_is_a_failure_named_and_not_retried_a_third_time(project):
    out = _sweep(project, "exits", EXITS)
    _assert_died_twice_then_gave_up(project, "exits", out, "worker-died", "worker died")


@pytest.fixture
def memory_cgroup():
    """A memory cgroup of ``MEMORY_LIMIT`` (cgroup v1, as root); skipped where none can be made."""
    cgroup = CGROUP_V1 / f"pdm-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        cgroup.mkdir()
        (cgroup / "memory.limit_in_bytes").write_text(str(MEMORY_LIMIT))
    except OSError as err:
        pytest.skip(f"no memory cgroup can be made here ({err}): the OOM kill is not tried")
    yield cgroup
    for _ in range(60):  # the sweep's processes leave as Ray shuts down
        try:
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(1)
    cgroup.rmdir()


@pytest.mark.slow
@pytest.mark.processes
def test_a_worker_the_oom_killer_ends_is_out_of_memory(project, memory_cgroup):
    out = _sweep(project, "hogs", HOGS, memory_cgroup)
    kills = (memory_cgroup / "memory.oom_control").read_text()
    assert "oom_kill 0\n" not in kills, kills  # the kernel killed in the cgroup: a real OOM
    _assert_died_twice_then_gave_up(project, "hogs", out, "out-of-memory", "out of memory")


# ---------------------------------------------------------------- the cause, from what Ray wrote
RAY_DEATH = """Failure # 1 (occurred at 2026-12-06_13-54-56)
The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
\tpid: 1987
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker \
exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common \
causes include: (1) the process was killed by the OOM killer due to high memory usage
"""
RAY_OOM = """Failure # 2 (occurred at 2026-12-06_13-55-10)
ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.
Memory on the node was 23.10GB / 24.00GB (0.962), which exceeds the memory usage threshold 0.95.
"""


def test_a_death_is_named_by_ray_s_exit_detail_not_its_list_of_common_causes():
    kind, reason = death_of(RAY_DEATH, oom_killed=False)
    assert kind is FailureKind.WORKER_DIED
    assert reason.splitlines()[0] == (
        "worker died: its process ended without a report and no stop was asked (SYSTEM_ERROR: "
        "Worker unexpectedly exits with a connection error code 2. End of file.)"
    )


def test_a_lost_node_or_a_ray_kill_is_not_the_trial_s_death():
    """A raylet lost with its node is the cluster's fault (``cluster/watch.py`` ends the sweep,
    its runs resumable); only a worker process that died, or Ray's memory monitor, is a death."""
    assert is_worker_death(last_failure(RAY_DEATH)) and is_worker_death(last_failure(RAY_OOM))
    node = "Failure # 1 (occurred at x)\nThe actor died because its node has died. Node Id: ab\n"
    killed = "Failure # 1 (occurred at x)\nThe actor is dead because it was killed by `ray.kill`."
    assert not is_worker_death(last_failure(node)) and not is_worker_death(last_failure(killed))
    assert not is_worker_death(last_failure(RAY_DEATH + node))  # the last failure counts


def test_out_of_memory_from_the_oom_counter_or_ray_s_memory_monitor():
    kind, reason = death_of(RAY_DEATH, oom_killed=True)
    assert kind is FailureKind.OUT_OF_MEMORY and reason.startswith("out of memory: the kernel")
    kind, reason = death_of(RAY_DEATH + RAY_OOM, oom_killed=False)  # the last failure counts
    assert kind is FailureKind.OUT_OF_MEMORY and "Ray's memory monitor" in reason


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_oom_kill_count_of_the_process_s_memory_cgroup(tmp_path, version):
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    if version == "v2":
        (proc / "cgroup").write_text("0::/user.slice/sweep\n")
        folder, name = root / "user.slice" / "sweep", "memory.events"
        text = "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n"
    else:  # in a container: the mount's root is the host's /process_api/abc
        (proc / "cgroup").write_text("5:devices:/\n4:memory:/process_api/abc/sweep\n")
        folder, name = root / "memory" / "sweep", "memory.oom_control"
        text = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    folder.mkdir(parents=True)
    (folder / name).write_text(text)
    assert oom_kills(proc, root) == 2
    (proc / "cgroup").write_text("0::/elsewhere\n")
    assert oom_kills(proc, root) is None
