"""`pdm sweep` end to end on a real local Ray and a real sqlite MLflow store."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections import Counter

import pytest

from pdmask.registry import load_registry

from . import procs
from .conftest import FOUR_TRIALS, pdm, pdm_background, sweep_runs, write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.processes]

CONTRACT_TAGS = {
    "pdm.sweep",
    "pdm.trial_hash",
    "pdm.method",
    "pdm.model",
    "pdm.precision",
    "pdm.delta",
    "pdm.seed",
    "pdm.backend",
    "pdm.git_sha",
    "pdm.git_dirty",
    "pdm.version.torch",
}


def finished_exactly_once(project, sweep: str) -> None:
    expected = {t.trial_hash for t in load_registry(project).expand(sweep)}
    runs = sweep_runs(project, sweep)
    per_hash = Counter(r.data.tags["pdm.trial_hash"] for r in runs)
    assert set(per_hash) == expected and set(per_hash.values()) == {1}, per_hash
    assert {r.info.status for r in runs} == {"FINISHED"}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{project / '.pdm' / 'mlflow.db'}")
    for r in runs:  # no duplicate or backward steps in any history
        for key in ("critic/score/mean", "val-core/synth/acc/mean_at_16"):
            steps = [m.step for m in client.get_metric_history(r.info.run_id, key)]
            assert steps and steps == sorted(set(steps)), (key, steps)


def _listeners_while_running(project, proc) -> list:
    """The sweep's listening sockets, read once its trials train (every Ray process is up)."""
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline:
        if _pid_files(project):
            time.sleep(1.0)
            return procs.listeners(procs.descendants(proc.pid) | procs.of_project(project))
        time.sleep(0.2)
    return []


def test_smoke_sweep_trains_and_listens_only_on_loopback_then_ui(project):
    proc = pdm_background(project, "sweep", "smoke", env={"CI": "true"})  # a CI log: lines
    watch = procs.Watch(proc.pid)
    listening = _listeners_while_running(project, proc)
    out, _ = proc.communicate(timeout=300)
    watch.stop()
    assert proc.returncode == 0, out
    _assert_progress_lines(project, out)
    # GCS, raylet, workers, dashboard and runtime-env agents: all on loopback, none reachable
    # from another host (before: 11-15 on `*`, 0.0.0.0 or the host's address).
    commands = " ".join(s.command for s in listening)
    assert len(listening) >= 6 and "gcs_server" in commands and "raylet" in commands, listening
    exposed = [s for s in listening if not s.loopback_only]
    assert not exposed, exposed
    assert not procs.survivors(project, watch), "processes outlived the sweep"

    finished_exactly_once(project, "smoke")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{project / '.pdm' / 'mlflow.db'}")
    for run in sweep_runs(project, "smoke"):
        assert set(run.data.tags) >= CONTRACT_TAGS, CONTRACT_TAGS - set(run.data.tags)
        assert "val-core/synth/acc/mean_at_16" in run.data.metrics
        assert run.data.params["method"] == run.data.tags["pdm.method"]
        # Params are plain values (the UI and its parallel coordinates show them), and the run
        # says what it is.
        assert "recipe_source.hash" in run.data.params, run.data.params
        assert not [v for v in run.data.params.values() if v.startswith("{")], run.data.params
        described = run.data.tags["mlflow.note.content"]
        assert described.startswith(run.data.tags["pdm.method"]) and "sweep smoke" in described
        # The smoke trains: rewards, gradients and masked tokens at some step (all 0 before).
        for key in ("critic/score/mean", "actor/grad_norm", "actor/pdm/masked_frac"):
            history = [m.value for m in client.get_metric_history(run.info.run_id, key)]
            assert len(history) == 4 and max(history) > 0, (key, history)
    # A second invocation skips everything (identity = trial hash).
    again = pdm(project, "sweep", "smoke")
    assert again.returncode == 0 and "2 already finished, 0 to run" in again.stdout
    # The plan shows them done.
    plan = pdm(project, "sweep", "smoke", "--dry-run")
    assert plan.stdout.count(" done") == 2

    ui = pdm_background(project, "ui", "--port", "0")
    try:
        line = ""
        deadline = time.time() + 120
        while "MLflow UI:" not in line and time.time() < deadline:
            line = ui.stdout.readline()
        url = line.split("MLflow UI:")[1].split()[0]
        ui_listening = procs.listeners(procs.descendants(ui.pid))
        assert ui_listening and not [s for s in ui_listening if not s.loopback_only], ui_listening
        body = (
            urllib.request.urlopen(
                f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=smoke", timeout=10
            )
            .read()
            .decode()
        )
        assert '"name": "smoke"' in body or '"name":"smoke"' in body
        runs = (
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{url}/api/2.0/mlflow/runs/search",
                    method="POST",
                    data=b'{"experiment_ids": ["1"]}',
                    headers={"Content-Type": "application/json"},
                ),
                timeout=10,
            )
            .read()
            .decode()
        )
        assert runs.count("pdm.trial_hash") == 2
    finally:
        ui.send_signal(signal.SIGINT)
        ui.wait(timeout=60)
    assert ui.returncode == 0


def _assert_progress_lines(project, out: str) -> None:
    """What a CI log of the smoke sweep shows: each slow phase and its time, a heartbeat with the
    counts, the summary's wall time and per-method results; no library's log lines (they are in
    the driver log)."""
    import re

    lines = out.splitlines()
    for phase, done in [("starting Ray…", "Ray started ("),
                        ("starting 2 trials", "first training step reported (")]:  # fmt: skip
        began = next(i for i, ln in enumerate(lines) if ln.startswith(phase))
        assert any(ln.startswith(done) for ln in lines[began + 1 :]), out
    beat = re.compile(r"^\[\d\d:\d\d:\d\d\] smoke: \d/2 done, \d running, 0 failed, \d queued; "
                      r"elapsed \S+, ETA \S+$")  # fmt: skip
    assert any(beat.match(ln) for ln in lines), out
    assert "sweep smoke: summary, wall time " in out, out
    results = [ln.split() for ln in lines if ln.strip().startswith(("dppo-topk-kl ", "pdm-agg "))]
    assert sorted(r[:2] for r in results) == [["dppo-topk-kl", "1"], ["pdm-agg", "1"]], out
    noise = [
        ln for ln in lines if re.search(r"\b(INFO|WARNING)\b|alembic|mlflow\.(?!db)|optuna", ln)
    ]
    assert not noise, noise
    driver_log = project / ".pdm" / "logs" / "smoke" / "driver.log"
    assert driver_log.is_file() and driver_log.stat().st_size > 0, "the libraries' lines are kept"


def _pid_files(project):
    return (
        list((project / ".pdm" / "trials").glob("*/pid"))
        if (project / ".pdm" / "trials").exists()
        else []
    )


def test_killed_trial_is_retried_and_finishes_once(project):
    write_sweep(project, "four", FOUR_TRIALS)
    proc = pdm_background(project, "sweep", "four")
    killed = None
    deadline = time.time() + 180
    while killed is None and time.time() < deadline and proc.poll() is None:
        for pid_file in _pid_files(project):
            pid = int(pid_file.read_text())
            try:
                os.kill(pid, signal.SIGKILL)
                killed = pid_file.parent.name
                break
            except ProcessLookupError:
                continue
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=300)
    assert killed is not None, "no trial process appeared to kill"
    assert proc.returncode == 0, out
    finished_exactly_once(project, "four")
    run = next(r for r in sweep_runs(project, "four") if r.data.tags["pdm.trial_hash"] == killed)
    assert int(run.data.tags["pdm.attempts"]) >= 2
    # a SIGKILL nobody asked of the sweep: a death with its cause (tune/deaths.py), then retried
    assert "worker died" in run.data.tags["pdm.failures"]


def test_two_concurrent_invocations_never_run_a_trial_twice(project):
    write_sweep(project, "four", FOUR_TRIALS.replace("max_concurrent: 1", "max_concurrent: 2"))
    first = pdm_background(project, "sweep", "four")
    second = pdm_background(project, "sweep", "four")
    out1, _ = first.communicate(timeout=300)
    out2, _ = second.communicate(timeout=300)
    finished_exactly_once(project, "four")
    for run in sweep_runs(project, "four"):
        assert run.data.tags["pdm.attempts"] == "1", run.data.tags  # trained by exactly one process
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    # each copy counts only the trials it trained as finished now; the other copy's are its
    # "finished by another copy" (or still running there, or finished before it started):
    # the two summaries' "finished now" add up to the four trials trained, each once
    rows = (
        "finished now",
        "finished by another copy of this sweep",
        "running in another invocation",
        "already finished (skipped)",
    )
    counts = [[_summary_count(out, row) for row in rows] for out in (out1, out2)]
    assert sum(c[0] for c in counts) == 4 and [sum(c) for c in counts] == [4, 4], out1 + out2


def _summary_count(out: str, row: str) -> int:
    """A row's count in a sweep's summary table."""
    found = re.findall(rf"{re.escape(row)}\W+(\d+)", out)
    assert len(found) == 1, f"{row!r} in:\n{out[-3000:]}"
    return int(found[0])


def test_bad_tracking_store_fails_before_launch(project):
    (project / ".pdm").mkdir(exist_ok=True)
    bad = project / ".pdm" / "mlflow.db"
    bad.write_bytes(b"this is not a database" * 100)
    out = pdm(project, "sweep", "smoke")
    assert out.returncode == 2
    assert "not a readable sqlite database" in out.stderr and str(bad) in out.stderr
    assert not (project / ".pdm" / "ray_results").exists() and not _pid_files(project)
    other = pdm(project, "sweep", "smoke", "--tracking-uri", "file:///tmp/nowhere")
    assert other.returncode == 2 and "plain file store" in other.stderr


def test_search_sweep_reports_best(project):
    # The searched recipe calls its delta-role parameter `radius`: the search sets it by role,
    # so each point trains the delta its tag shows (by name it trained the template's value).
    pdm_agg = (project / "recipes" / "pdm_agg.py").read_text()
    (project / "recipes" / "pdm_agg_radius.py").write_text(
        pdm_agg.replace('name="pdm-agg"', 'name="pdm-agg-radius"').replace(
            'params={"delta": DELTA', 'params={"radius": DELTA'
        )
    )
    write_sweep(
        project,
        "search",
        """backend: sim
profile: smoke
seeds: 1
search:
  metric: val-core/synth/acc/mean_at_16
  mode: max
  budget: 3
  space:
    delta: {low: 0.02, high: 0.3, log: true}
  base: {method: pdm-agg-radius, model: qwen3-4b-base, precision: fp8-rollout}
""",
    )
    out = pdm(project, "sweep", "search")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "best trial:" in out.stdout
    runs = sweep_runs(project, "search")
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags["pdm.delta"] for r in runs}) == 3
    assert all(0.02 <= float(r.data.tags["pdm.delta"]) <= 0.3 for r in runs)
    for run in runs:  # the value trained is the value searched
        assert float(run.data.params["params.radius"]) == float(run.data.tags["pdm.delta"])
    # nothing left to run: the summary still names the best trial, and counts (not a dict) in
    # its rows (the early return once passed the best trial as the "elsewhere" count)
    again = pdm(project, "sweep", "search")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "best trial:" in again.stdout and "run_name" not in again.stdout, again.stdout
