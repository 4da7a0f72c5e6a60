"""Every trial's log lands in the state folder, goes with its MLflow run, and `pdm logs` prints it;
nothing the sweep writes lands outside the state folder.

The state folder is deep on purpose (as a pytest tmp path under a long project path is): Ray's
AF_UNIX socket paths would not fit under it, so Ray reaches its folder in the state folder through
a short link, which is gone when the sweep ends. The sweep's system temp folder (TMPDIR) is a fresh
one that must be empty afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.orchestration.conftest import env_for, pdm, write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.processes]

# Writes to stdout and stderr the three ways a trial's output can reach its process's file
# descriptors: Python's print, a bare write(2) (as C code does), and a subprocess.
CHATTY = '''"""Trains like pdm-agg's baseline; says hello once per process, three ways."""

import os
import subprocess
import sys

import torch

from pdmask.registry import Recipe

SAID = []


def chatty(batch):
    if not SAID:
        SAID.append(True)
        print("chatty: hello from print", flush=True)
        os.write(2, b"chatty: hello from fd 2\\n")
        subprocess.run([sys.executable, "-c", "print('chatty: hello from a subprocess')"], check=True)
    return torch.zeros_like(batch.response_mask)


RECIPE = Recipe(
    name="chatty",
    display_name="Chatty",
    color="#009900",
    summary=__doc__.splitlines()[0],
    mask=chatty,
)
'''

SWEEP = """backend: sim
profile: smoke
seeds: 1
max_concurrent: 2
retries: 1
grid:
  method: [chatty, pdm-agg]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.15]
"""


@pytest.fixture
def deep_state(project: Path) -> Path:
    """A state folder whose path is 150 bytes or more: Ray's sockets do not fit under it."""
    state = project / "state-folder-of-a-project-with-a-long-path" / ("deeper" * 12) / ".pdm"
    assert len(os.fsencode(state)) >= 150
    return state


@pytest.fixture
def fresh_tmp():
    """An empty folder the sweep gets as its system temp folder (TMPDIR)."""
    folder = Path(tempfile.mkdtemp(prefix="pdmt-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)  # links are removed, never followed


def test_trial_logs_land_in_the_state_folder_and_go_with_their_runs(project, deep_state, fresh_tmp):
    from pdmask.tracking.store import sqlite_client

    (project / "recipes" / "chatty.py").write_text(CHATTY)
    write_sweep(project, "smoke", SWEEP)
    env = {"PDM_HOME": str(deep_state), "TMPDIR": str(fresh_tmp)}
    ray_results = Path.home() / "ray_results"
    had_ray_results = ray_results.exists()

    out = pdm(project, "sweep", "smoke", env=env, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "too deep for its sockets" in text  # said once, in one line
    # Nothing outside the state folder: the temp folder is empty again (the link is gone),
    # and no ~/ray_results appeared.
    assert list(fresh_tmp.iterdir()) == []
    assert had_ray_results or not ray_results.exists()
    # Ray's own folders are in the state folder, and its pointer to the session still leads there.
    sessions = [s.resolve() for s in (deep_state / "ray").glob("session_2*")]
    assert any((s / "logs").is_dir() for s in sessions)  # two when Ray's first start timed out
    assert (deep_state / "ray" / "session_latest").resolve() in sessions

    client = sqlite_client(f"sqlite:///{deep_state / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    assert len(runs) == 2
    for run in runs:
        name, run_id = run.data.tags["mlflow.runName"], run.info.run_id
        file = f"{name}.{run.data.tags['pdm.trial_hash'][:8]}.log"
        log = deep_state / "logs" / "smoke" / file
        content = log.read_text()
        # The trial wrote it: its header names this run, its end line says how the attempt ended.
        assert f"=== pdm trial log: {name} attempt 1 (trial " in content
        assert f", run {run_id}) started" in content
        assert content.rstrip().endswith("=== attempt ended: finished ===")
        # a line per evaluation (the smoke profile: 4 steps, evaluated at 0, 2 and 4)
        evaluations = re.findall(r"^step (\d)/4: avg@16 [01]\.\d{3}(.*)$", content, re.M)
        assert [step for step, _ in evaluations] == ["0", "2", "4"], content[-2000:]
        trained = re.compile(r"^, masked \d+\.\d\d %, entropy \d+\.\d{3}, \d+\.\d\d s/step$")
        assert all(trained.match(rest) for _, rest in evaluations[1:]), evaluations
        if name.startswith("chatty"):
            for how in ("print", "fd 2", "a subprocess"):
                assert f"chatty: hello from {how}\n" in content, content[-2000:]
        # The same file is the run's artifact.
        assert [a.path for a in client.list_artifacts(run_id, "logs")] == [f"logs/{file}"]
        copy = client.download_artifacts(run_id, f"logs/{file}", str(project))
        assert Path(copy).read_text() == content
        # Tune's trial folder is named after the run.
        assert list((deep_state / "ray_results").glob(f"smoke-*/{name}"))

    chatty_name = next(
        r.data.tags["mlflow.runName"] for r in runs if r.data.tags["pdm.method"] == "chatty"
    )
    shown = pdm(project, "logs", chatty_name, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "chatty: hello from a subprocess" in shown.stdout
    # --follow on a run that has ended prints it and returns.
    followed = pdm(
        project, "logs", chatty_name, "--follow", "--sweep", "smoke", env=env, timeout=60
    )
    assert followed.returncode == 0 and followed.stdout == shown.stdout
    # By trial-hash prefix, too.
    chatty_hash = next(
        r.data.tags["pdm.trial_hash"] for r in runs if r.data.tags["pdm.method"] == "chatty"
    )
    assert pdm(project, "logs", chatty_hash[:8], env=env).stdout == shown.stdout

    typo = pdm(project, "logs", chatty_name.replace("chatty", "chaty"), env=env)
    assert typo.returncode == 2
    assert f"did you mean {chatty_name!r}" in typo.stderr
    assert "Traceback" not in typo.stderr
    assert list(fresh_tmp.iterdir()) == []


def test_follow_prints_new_lines_and_stops_on_ctrl_c(project):
    """A log with no run behind it (a file written by hand) is followed until Ctrl-C: exit 130."""
    log = project / ".pdm" / "logs" / "other" / "by-hand.log"
    log.parent.mkdir(parents=True)
    log.write_text("first line\n")
    follower = subprocess.Popen(
        [sys.executable, "-m", "pdmask", "logs", "by-hand", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(project),
        cwd=project,
    )
    try:
        assert follower.stdout.readline() == "first line\n"
        with log.open("a") as more:
            more.write("second line\n")
        assert follower.stdout.readline() == "second line\n"  # printed while it follows
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 130, err
    assert out == ""
    assert "Traceback" not in err


def test_links_of_sigkilled_drivers_are_removed_by_the_next_sweep(tmp_path):
    from pdmask.orchestration.cluster.local_ray import _remove_stale_links

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    target = tmp_path / "state-ray"
    target.mkdir()
    (tmp_path / f"pdm-ray-{dead}").symlink_to(target)
    (tmp_path / f"pdm-ray-{os.getpid()}").symlink_to(target)  # a live driver's
    (tmp_path / "pdm-ray-1").mkdir()  # not a link: never touched
    _remove_stale_links(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["state-ray", f"pdm-ray-{os.getpid()}", "pdm-ray-1"])
    assert target.is_dir()
