"""`pdmask.runs`, `pdm runs` and `pdm clean` on the store of one real `smoke` sweep.

The sweep runs once for the module (a real local Ray, a real sqlite store, the embedded backend);
the tests read its runs, then `pdm clean` removes its finished checkpoints and a rerun of the
sweep still finds every trial finished.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, pdm, store_client

pytestmark = [pytest.mark.slow, pytest.mark.processes]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A scratch project whose store holds one finished `smoke` sweep."""
    root = tmp_path_factory.mktemp("results")
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, root / name)
    (root / ".pdm").mkdir()
    done = pdm(root, "sweep", "smoke", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture(scope="module")
def planned(project: Path) -> list[dict]:
    """The sweep's trials as its dry run lists them (config and tags)."""
    plan = pdm(project, "sweep", "smoke", "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    return json.loads(plan.stdout)["trials"]


@pytest.fixture
def frame(project: Path, monkeypatch):
    import pdmask

    monkeypatch.setenv("PDM_PROJECT", str(project))
    monkeypatch.setenv("PDM_HOME", str(project / ".pdm"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return pdmask.runs("smoke", tracking_uri=f"sqlite:///{project / '.pdm' / 'mlflow.db'}")


def _records(rows: list[dict]) -> list[dict]:
    """Rows without their empty cells (a run has no value for another recipe's params)."""
    out = []
    for row in rows:
        kept = {}
        for key, value in row.items():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            kept[key] = value.item() if hasattr(value, "item") else value
        out.append(kept)
    return sorted(out, key=lambda r: r["run_id"])


def test_the_frame_has_one_finished_row_per_trial_with_its_tags(frame, planned):
    assert len(frame) == len(planned) == 2
    by_hash = frame.set_index("trial_hash")
    for trial in planned:
        tags = trial["tags"]
        row = by_hash.loc[tags["pdm.trial_hash"]]
        for column in ("method", "model", "precision", "backend", "sweep", "setting"):
            assert row[column] == tags[f"pdm.{column}"]
        assert row["delta"] == float(tags["pdm.delta"]) and row["seed"] == int(tags["pdm.seed"])
        assert row["status"] == "FINISHED" and row["attempts"] == 1
        assert math.isfinite(row["headline_final"]) and math.isfinite(row["headline_best"])
        assert row["headline_best"] >= row["headline_final"]
        assert row["wall_s"] > 0
        # params as plain values: a float is a float, not its text
        assert row["params.delta"] == float(tags["pdm.delta"])
    assert frame["run_name"].is_unique


def test_runs_json_is_the_frame(project, frame):
    listed = pdm(project, "runs", "smoke", "--json")
    assert listed.returncode == 0, listed.stderr
    assert _records(json.loads(listed.stdout)) == _records(frame.to_dict("records"))


def test_runs_table_lists_every_run_whole(project, frame):
    shown = pdm(project, "runs", "smoke")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    for name in frame["run_name"]:
        (line,) = [line for line in lines if name in line.split()]  # one row, not folded
        assert "FINISHED" in line
    every = pdm(project, "runs")  # every sweep of the store: a sweep column
    assert every.returncode == 0 and all(
        any(ln.split()[:2] == ["smoke", name] for ln in every.stdout.splitlines())
        for name in frame["run_name"]
    ), every.stdout


def test_an_unknown_sweep_is_exit_2_with_did_you_mean(project):
    wrong = pdm(project, "runs", "smok")
    assert wrong.returncode == 2
    assert "unknown sweep 'smok'" in wrong.stderr and "did you mean 'smoke'" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_history_is_every_logged_point_of_a_metric_in_long_format(project, frame):
    import pandas as pd

    import pdmask
    from pdmask.errors import ConfigError
    from pdmask.tracking.metric_names import is_headline

    uri = f"sqlite:///{project / '.pdm' / 'mlflow.db'}"
    long = pdmask.history("smoke", tracking_uri=uri)  # the headline metric, one per dataset
    client = store_client(project)
    stored = sorted(
        (run_id, point.key, point.step, point.value, point.timestamp)
        for run_id in frame["run_id"]
        for key in client.get_run(run_id).data.metrics
        if is_headline(key)
        for point in client.get_metric_history(run_id, key)
    )
    millis = (long["timestamp"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta("1ms")
    points = zip(long["run_id"], long["metric"], long["step"], long["value"], millis, strict=True)
    assert sorted(points) == stored and stored  # raw: every point, as logged
    runs = frame.set_index("run_id")
    for run_id, rows in long.groupby("run_id"):
        for column in ("run_name", "method", "setting", "seed", "backend", "trial_hash"):
            assert set(rows[column]) == {runs.loc[run_id, column]}
        last = rows[rows["step"] == rows["step"].max()]  # the runs table's final: their mean
        assert last["value"].mean() == pytest.approx(runs.loc[run_id, "headline_final"])
    same = pdmask.history("smoke", metric="val-core/*/acc/mean@16", tracking_uri=uri)
    assert same.equals(long)  # `@` as verl writes it, `_at_` as MLflow stores it
    entropy = pdmask.history("smoke", metric="actor/entropy", tracking_uri=uri)
    assert set(entropy["metric"]) == {"actor/entropy"}
    assert entropy.groupby("run_id")["step"].nunique().min() > 1  # per step, not a final
    with pytest.raises(ConfigError, match="did you mean 'actor/entropy'"):
        pdmask.history("smoke", metric="actor/entropi", tracking_uri=uri)
    with pytest.raises(ConfigError, match="did you mean 'smoke'"):
        pdmask.history("smok", tracking_uri=uri)


def _size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file())


def test_clean_lists_then_removes_finished_checkpoints_and_a_rerun_trains_nothing(project, frame):
    state = project / ".pdm"
    checkpoints = sorted((state / "trials").iterdir())
    assert {p.name for p in checkpoints} == set(frame["trial_hash"])
    assert all(_size(p) > 0 for p in checkpoints)
    # something outside the state folder, reachable through a link inside it, and an old Ray
    # session: the first must survive, the second go
    outside = project / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "data").write_text("not pdm's")
    (state / "trials" / ("f" * 64)).symlink_to(outside / "keep")
    old_session = state / "ray" / "session_2000-01-01_00-00-00_000000_1"
    (old_session / "logs").mkdir(parents=True)
    (old_session / "logs" / "raylet.out").write_text("x" * 5000)
    long_ago = time.time() - 86400
    for p in (old_session / "logs" / "raylet.out", old_session / "logs", old_session):
        os.utime(p, (long_ago, long_ago))
    store = (state / "mlflow.db").read_bytes()

    dry = pdm(project, "clean")
    assert dry.returncode == 0, dry.stderr
    for folder in checkpoints:
        (line,) = [ln for ln in dry.stdout.splitlines() if f"trials/{folder.name}" in ln]
        assert line.split()[0] == "checkpoint" and re.search(r" \d+\.\d (KiB|MiB) ", line)
    assert old_session.name in dry.stdout and "would remove" in dry.stdout
    assert "nothing deleted" in dry.stdout
    assert all(p.is_dir() for p in checkpoints) and old_session.is_dir()  # a dry run

    done = pdm(project, "clean", "--yes")
    assert done.returncode == 0, done.stderr
    assert "freed" in done.stdout
    assert not any(p.exists() for p in checkpoints) and not old_session.exists()
    assert (outside / "keep" / "data").read_text() == "not pdm's"  # nothing outside the state
    assert (state / "mlflow.db").read_bytes() == store  # the store is untouched

    again = pdm(project, "sweep", "smoke", timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 already finished, 0 to run" in again.stdout
    assert not (state / "trials").exists() or not any(
        p.name in set(frame["trial_hash"]) for p in (state / "trials").iterdir()
    )
    runs = store_client(project).search_runs(
        [store_client(project).get_experiment_by_name("smoke").experiment_id]
    )
    assert sorted(r.info.run_id for r in runs) == sorted(frame["run_id"])


def _aged(folder: Path) -> Path:
    """``folder`` made, with a file, all last changed a day ago (an old leftover)."""
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "out").write_text("x" * 100)
    long_ago = time.time() - 86400
    for p in (folder / "logs" / "out", folder / "logs", folder):
        os.utime(p, (long_ago, long_ago))
    return folder


def test_clean_keeps_what_a_live_process_uses_and_what_just_changed(project):
    state = project / ".pdm"
    used = _aged(state / "ray" / "session_2000-01-02_00-00-00_000000_2")
    # a live process naming the session on its command line, as Ray's GCS and raylet do
    ray_like = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", f"--session-name={used.name}"]
    )
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    ended = _aged(state / "ray_results" / f"smoke-20000102-000000-{gone.stdout.strip()}")
    running = _aged(state / "ray_results" / f"smoke-20000102-000001-{ray_like.pid}")
    try:
        dry = pdm(project, "clean")
        assert dry.returncode == 0, dry.stderr
        kept = {
            ln.split()[1].rstrip(":"): ln
            for ln in dry.stdout.splitlines()
            if ln.startswith("kept ")
        }
        assert "a live Ray uses it" in kept[f"ray/{used.name}"]
        assert f"pid {ray_like.pid}) is running" in kept[f"ray_results/{running.name}"]
        assert f"ray_results/{ended.name}" in dry.stdout and f"ray_results/{ended.name}" not in kept
        # the module's own sweep ran minutes ago: its session is recent, so it stays
        own = [
            p
            for p in (state / "ray").iterdir()
            if p.name.startswith("session_")
            and not p.name.startswith("session_2000")
            and not p.is_symlink()
        ]
        assert own and all("changed in the last" in kept[f"ray/{p.name}"] for p in own)
        done = pdm(project, "clean", "--yes")
        assert done.returncode == 0, done.stderr
        assert not ended.exists() and used.is_dir() and running.is_dir()
        assert all(p.is_dir() for p in own)
    finally:
        ray_like.kill()
        ray_like.wait()


def _history(client, run) -> dict[str, list[tuple]]:
    run_id = run.info.run_id
    return {
        key: sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }


def test_overrides_under_another_name_or_the_same_train_only_the_new_seed(project, monkeypatch):
    """Issue 47's acceptance at the smallest scale: after the finished `smoke`, its copy under
    another name with `method=pdm-agg seed=[0,1]` trains only seed 1 and links seed 0 (its
    whole history); `smoke` itself with the same overrides then trains nothing (seed 0 is its
    own, seed 1 is linked back), and a rerun links nothing twice. Last in the module: the other
    tests count the store's runs and checkpoints."""
    from pdmask.tracking.reuse import REUSED_FROM_RUN, REUSED_FROM_SWEEP

    smoke = (project / "sweeps" / "smoke.yaml").read_text()
    (project / "sweeps" / "smoke-again.yaml").write_text(
        smoke.replace("name: smoke", "name: smoke-again")
    )
    words = ("method=pdm-agg", "seed=[0,1]")
    from typer.testing import CliRunner

    from pdmask.cli import app

    env = {
        "PDM_PROJECT": str(project),
        "PDM_HOME": str(project / ".pdm"),
        "MLFLOW_TRACKING_URI": None,
    }
    plan = CliRunner().invoke(app, ["sweep", "smoke-again", *words, "--dry-run", "--json"], env=env)
    assert plan.exit_code == 0, plan.output  # in this process: a dry run reads, writes nothing
    data = json.loads(plan.stdout)
    assert data["overrides"] == "method=pdm-agg seed=[0, 1]"
    status = {row["seed"]: row["status"] for row in data["trials"]}
    assert status[0].startswith("reuse smoke/pdm-agg-") and status[1] == "todo", status
    assert [o["canary"] for o in data["launch_order"]] == [True]  # seed 1 alone

    out = pdm(project, "sweep", "smoke-again", *words, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(method=pdm-agg seed=[0, 1]): 2 trials, 1 reused from other sweeps, 0 already " in (
        out.stdout
    )
    rows = {
        ln.rsplit(None, 1)[0].strip(): ln.split()[-1]
        for ln in out.stdout.splitlines()
        if ln.strip()
    }
    assert (
        rows["finished now"] == "1"
        and rows["reused from other sweeps (linked, not trained)"] == "1"
    )
    assert re.search(r"^\s*pdm-agg\s+2\s+\d", out.stdout, re.M), out.stdout  # both in the summary

    client = store_client(project)
    runs = client.search_runs([client.get_experiment_by_name("smoke-again").experiment_id])
    assert sorted(r.data.tags["pdm.seed"] for r in runs) == ["0", "1"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags["pdm.overrides"] for r in runs} == {"method=pdm-agg seed=[0, 1]"}
    (linked,) = [r for r in runs if REUSED_FROM_RUN in r.data.tags]
    source = client.get_run(linked.data.tags[REUSED_FROM_RUN])
    assert linked.data.tags[REUSED_FROM_SWEEP] == "smoke" and linked.data.tags["pdm.seed"] == "0"
    assert source.data.tags["pdm.trial_hash"] == linked.data.tags["pdm.trial_hash"]
    assert (
        _history(client, linked) == _history(client, source) and len(_history(client, source)) > 3
    )

    import pdmask

    monkeypatch.setenv("PDM_PROJECT", str(project))
    monkeypatch.setenv("PDM_HOME", str(project / ".pdm"))
    frame = pdmask.runs("smoke-again", tracking_uri=f"sqlite:///{project / '.pdm' / 'mlflow.db'}")
    assert sorted(frame["seed"].astype(int)) == [0, 1] and frame["headline_final"].notna().all()

    same = pdm(project, "sweep", "smoke", *words)  # the trained seed 1 is linked back
    assert same.returncode == 0, same.stdout + same.stderr
    assert "2 trials, 1 reused from other sweeps, 1 already finished, 0 to run" in same.stdout
    again = pdm(project, "sweep", "smoke-again", *words)
    assert again.returncode == 0 and "2 already finished, 0 to run" in again.stdout, again.stdout
    runs = client.search_runs([client.get_experiment_by_name("smoke-again").experiment_id])
    assert len(runs) == 2  # nothing linked twice
