"""Shared storage proven, not assumed, and authentication by default, against real parts.

Once per module (``two_node.site``): a two-node Ray cluster on this machine with token
authentication (head + a second ``ray start --address`` with its own temporary folder, loopback
only), a one-node head without authentication, and a real ``mlflow server`` on 127.0.0.1.

- ``pdm cluster check`` prints one row per node, every check passing, with the token read from a
  file (no node has a GPU here: the training-node probes are ``test_training_nodes.py``'s); and
  catches, on each node, an unreachable tracking server, a checkpoint root that cannot be
  written (a file), a share without the room the plan needs, missing data, an empty model
  folder, a Hub that does not answer, another pdmask source (the expected version is the
  injectable ``CheckSpec.versions``: one machine has one install), each named with its fix; and
  a checkpoint root that is writable on every node but not shared (a relative path, which each
  node resolves in its own working folder: the two nodes' folders differ, as two machines'
  disks would);
- ``pdm sweep`` to an address refuses a sqlite store, an unset checkpoint root and unset data
  (exit 2, all at once, nothing submitted), and runs the cluster check before submitting: a node
  that cannot write the checkpoint root stops it (exit 2, node and check named, no job, no run);
- an address whose job API answers without authentication is refused (exit 2) unless
  ``--insecure``; a wrong token is refused; the token is never printed.
"""

from __future__ import annotations

import io
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from pdmask.orchestration.cluster.probe import CHECKS
from tests.cluster.conftest import env_for, pdm_cmd
from tests.cluster.model_folder import tiny_model_folder
from tests.cluster.two_node import site

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]

ROW = re.compile(r"^\s*\S+\s+127\.0\.0\.1\s+[0-9a-f]{8}\s+(head|worker)\s+(.*)$", re.M)
SWEEP = """name: shared
description: cluster check sweep
backend: verl
cluster: h20x32
steps: 3
grid:
  method: [grpo-clip-higher]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.15]
"""


@pytest.fixture(scope="module")
def cluster():
    with site() as s:
        yield s


@pytest.fixture
def shared(tmp_path: Path, project: Path) -> dict[str, str]:
    """Site settings every node can use (one machine: its disk is every node's)."""
    (project / "sweeps" / "shared.yaml").write_text(SWEEP)
    data = tmp_path / "data"
    data.mkdir()
    for name in ("dapo_math_train.parquet", "aime_val.parquet"):
        (data / name).write_bytes(b"PAR1")
    # every model of the h20x32 profile, complete (a small one under each name)
    first = tiny_model_folder(tmp_path / "models" / "Qwen3-4B-Base")
    for name in ("Qwen3-8B-Base", "Qwen3-30B-A3B-Base"):
        shutil.copytree(first, tmp_path / "models" / name)
    return {
        "PDM_DATA_DIR": str(data),
        "PDM_VERL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "PDM_MODEL_ROOT": str(tmp_path / "models"),
    }


def pdm(cluster, project: Path, *args: str, timeout: float = 180, **env: str):
    """``pdm ARGS`` as a user's shell runs it; its output, which must never hold the token."""
    out = subprocess.run(
        pdm_cmd(*args),
        env=env_for(project, **env),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    text = out.stdout + out.stderr
    assert cluster.token not in text, "the token was printed"
    return out.returncode, text


def jobs_on(cluster, prefix: str = "pdm-") -> list[str]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(
        cluster.address, headers={"Authorization": f"Bearer {cluster.token}"}
    )
    return [j.submission_id for j in client.list_jobs() if j.submission_id.startswith(prefix)]


def test_the_check_passes_on_every_node_with_the_token_from_a_file(cluster, project, shared):
    token_file = project / "token"
    token_file.write_text(cluster.token + "\n")
    code, out = pdm(
        cluster,
        project,
        "cluster",
        "check",
        "--address",
        cluster.address,
        "--tracking-uri",
        cluster.tracking_uri,
        "--ray-token-file",
        str(token_file),
        **shared,
    )
    assert code == 0, out
    rows = ROW.findall(out)
    assert sorted(role for role, _ in rows) == ["head", "worker"], out
    assert all(cells.split() == ["ok"] * len(CHECKS) for _, cells in rows), out
    assert "shared by 2 node(s)" in out and "every check passed on all 2 node(s)" in out
    assert list(Path(shared["PDM_VERL_CHECKPOINT_DIR"]).iterdir()) == []  # its files removed


def test_the_check_names_each_failing_check_on_each_node(cluster, tmp_path, monkeypatch):
    from rich.console import Console

    from pdmask.orchestration.cluster.check import CheckSpec, render, run_check, submitter_versions

    monkeypatch.setenv("RAY_AUTH_TOKEN", cluster.token)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    empty = tmp_path / "models" / "Qwen3-4B-Base"
    empty.mkdir(parents=True)
    stale = "0.1.0 (source 000000000000)"  # another commit of pdmask, or local edits
    spec = CheckSpec(
        tracking_uri=f"http://127.0.0.1:{closed}",
        checkpoint_root=str(not_a_folder),
        checkpoint_need_bytes=shutil.disk_usage(tmp_path).total * 2,
        data_files=(str(tmp_path / "missing.parquet"),),
        model_root=str(tmp_path / "models"),
        model_paths=(str(empty),),
        hub_models=("Qwen/Qwen3-4B-Base",),
        hub_endpoint=f"http://127.0.0.1:{closed}",
        versions={**submitter_versions(), "pdmask": stale},
    )
    report = run_check(cluster.address, spec)
    failing = ("tracking", "checkpoints", "space", "data", "models", "hub", "versions")
    assert len(report.nodes) == 2
    for node in report.nodes:
        assert node.failed() == list(failing), node.checks
        here = submitter_versions()["pdmask"]
        assert f"pdmask {here} (expected: {stale})" in node.checks["versions"]["detail"]
        assert "cannot write under" in node.checks["checkpoints"]["detail"]
        assert f"{empty}: no config.json" in node.checks["models"]["detail"]
        assert all(node.checks[c]["fix"] for c in failing)
    problems = {(p.file, p.field): p.message for p in report.problems()}
    assert len(problems) == 2 * len(failing) and all("Fix: " in m for m in problems.values())
    shown = io.StringIO()
    render(report, Console(file=shown, width=300))
    lines = [x for x in shown.getvalue().splitlines() if x.startswith("FAILED node")]
    assert len(lines) == 2 * len(failing)
    assert all(n.node_id[:8] in "".join(lines) for n in report.nodes)

    # Writable on each node, but each node's own folder: not shared.
    apart = run_check(cluster.address, CheckSpec(cluster.tracking_uri, checkpoint_root="ckpt"))
    for node in apart.nodes:
        assert node.failed() == ["checkpoints"], node.checks
        assert "is not shared" in node.checks["checkpoints"]["detail"]


def test_the_sweep_refuses_unshared_settings_before_any_job(cluster, project):
    (project / "sweeps" / "shared.yaml").write_text(SWEEP)
    code, out = pdm(
        cluster,
        project,
        "sweep",
        "shared",
        "--backend",
        "verl",
        "--address",
        cluster.address,
        "--no-figures",
        RAY_AUTH_TOKEN=cluster.token,
        PDM_DATA_DIR="",  # env_for's default: unset here
    )
    assert code == 2, out
    assert "3 problem(s) found, nothing was launched" in out, out
    assert "--tracking-uri / MLFLOW_TRACKING_URI: sqlite:///" in out
    assert "PDM_VERL_CHECKPOINT_DIR: (unset)" in out and "PDM_DATA_DIR: (unset)" in out
    assert not jobs_on(cluster)  # no trial job was submitted


def test_the_sweep_runs_the_check_first_and_stops_on_a_failing_node(cluster, project, shared):
    host = socket.gethostname()
    if not socket.gethostbyname(host).startswith("127."):
        pytest.skip(f"{host} does not resolve to this machine's loopback address")
    # A name the nodes would resolve (not a loopback name), reaching the server on 127.0.0.1 here.
    uri = cluster.tracking_uri.replace("127.0.0.1", host)
    not_a_folder = project / "checkpoints-file"
    not_a_folder.write_text("")
    code, out = pdm(
        cluster,
        project,
        "sweep",
        "shared",
        "--address",
        cluster.address,
        "--tracking-uri",
        uri,
        "--no-figures",
        RAY_AUTH_TOKEN=cluster.token,
        **{**shared, "PDM_VERL_CHECKPOINT_DIR": str(not_a_folder)},
    )
    assert code == 2, out
    assert len(ROW.findall(out)) == 2, out
    assert re.search(
        r"node \S+ 127\.0\.0\.1 [0-9a-f]{8} \(worker\): checkpoints: cannot write", out
    )
    assert "--skip-cluster-check" in out
    assert not jobs_on(cluster)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cluster.tracking_uri)
    experiment = client.get_experiment_by_name("shared")
    assert experiment is None or not client.search_runs([experiment.experiment_id])


def test_an_unauthenticated_job_api_is_refused_unless_insecure(cluster, project, shared):
    args = ("--address", cluster.open_address, "--tracking-uri", cluster.tracking_uri)
    code, out = pdm(cluster, project, "cluster", "check", *args, **shared)
    assert code == 2 and "answers without authentication" in out and "--insecure" in out, out
    code, out = pdm(cluster, project, "sweep", "shared", *args, "--no-figures", **shared)
    assert code == 2 and "answers without authentication" in out, out
    code, out = pdm(cluster, project, "cluster", "check", *args, "--insecure", **shared)
    assert code == 0 and len(ROW.findall(out)) == 1, out


def test_a_wrong_or_missing_token_is_refused_without_printing_it(cluster, project, shared):
    args = ("cluster", "check", "--address", cluster.address)
    code, out = pdm(cluster, project, *args, RAY_AUTH_TOKEN="wrong-" + cluster.token[::-1])
    assert code == 2 and "refuses this token (HTTP 403)" in out, out
    assert cluster.token[::-1] not in out
    # a HOME of its own: a local ray.init() elsewhere may have left ~/.ray/auth_token
    code, out = pdm(cluster, project, *args, HOME=str(project))
    assert code == 2 and "requires Ray's authentication token and none is set" in out, out


def test_the_cluster_listens_only_on_loopback(cluster):
    from tests.orchestration.procs import descendants, listeners

    pids = set().union(*(descendants(p.process.pid) for p in cluster.processes))
    found = listeners(pids)
    assert len({x.port for x in found}) > 10, "the scan saw too few servers: it checks nothing"
    assert not [f"{x.command} {x.address}:{x.port}" for x in found if not x.loopback_only]
