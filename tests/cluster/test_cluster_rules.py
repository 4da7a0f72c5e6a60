"""The pure rules behind the cluster checks (fast: no Ray, no MLflow server).

What a cluster's nodes cannot share (``shared_storage``), where the Ray token comes from and how a
job API's answers are read (``ray_auth``, against a small HTTP server on loopback that answers as
Ray's job API does: 200 without authentication, else 401 without a token and 403 for a wrong one),
and how a report names its failures (``cluster_check``). The real cluster: test_cluster_check.py.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdmask.backends.verl.site_inputs import CHECKPOINTS, DATA, MODELS, unshared_settings
from pdmask.orchestration.cluster.auth import (
    TokenUnreadable,
    auth_problems,
    headers_for,
    scrub,
    token_source,
)
from pdmask.orchestration.cluster.check import ClusterReport, NodeReport
from pdmask.orchestration.cluster.shared_storage import (
    TRACKING,
    tracking_problems,
    tracking_uri_problem,
)


def storage_problems(uri: str, **paths) -> list:
    """What a remote address refuses of a VeRL sweep's settings: the tracking store (the job
    loop's rule), then the backend's paths, as ``ray_jobs_checks.unshared`` puts them."""
    return tracking_problems(uri) + unshared_settings(**paths)


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:////shared/mlflow.db",
        "sqlite:///mlflow.db",
        "file:///tmp/mlruns",
        "/tmp/mlruns",
        "http://localhost:5000",
        "http://127.0.0.1:5000",
        "http://127.0.1.1:5000",
        "http://[::1]:5000",
        "http://0.0.0.0:5000",
        "http://mlflow.localhost",
        "postgresql://u:p@127.0.0.1/mlflow",
    ],
)
def test_uris_other_nodes_cannot_reach_are_refused(uri):
    assert tracking_uri_problem(uri)


@pytest.mark.parametrize(
    "uri",
    [
        "http://tracking:5000",
        "https://mlflow.example.com",
        "http://10.0.0.5:5000",
        "postgresql://u:p@db.internal/mlflow",
        "databricks",
    ],
)
def test_uris_every_node_can_reach_pass(uri):
    assert tracking_uri_problem(uri) is None


def test_every_unshareable_setting_is_named_at_once_without_passwords():
    problems = storage_problems(
        "sqlite:////home/me/.pdm/mlflow.db", checkpoint_dir=None, data_dir=None, model_root="models"
    )
    assert [p.file for p in problems] == [TRACKING, CHECKPOINTS, DATA, MODELS]
    assert all(p.message for p in problems)
    (shown,) = storage_problems(
        "http://me:secret@localhost:5000",
        checkpoint_dir="/shared/ck",
        data_dir="/shared/data",
        model_root=None,
    )
    assert "secret" not in str(shown)
    relative = storage_problems(
        "http://tracking:5000", checkpoint_dir="ck", data_dir="data", model_root=None
    )
    assert [p.file for p in relative] == [CHECKPOINTS, DATA]
    assert all("relative path" in p.message for p in relative)
    built = storage_problems(
        "http://tracking:5000",
        checkpoint_dir="/shared/ck",
        data_dir=None,
        model_root=None,
        data_built_here=True,
    )
    assert built == []


def test_the_token_is_found_where_ray_looks_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    pdm_file, ray_file = tmp_path / "pdm-token", tmp_path / "ray-token"
    pdm_file.write_text("from-pdm-file\n")
    ray_file.write_text("from-ray-path")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-default")
    env = {
        "RAY_AUTH_TOKEN": "from-env",
        "PDM_RAY_TOKEN_FILE": str(pdm_file),
        "RAY_AUTH_TOKEN_PATH": str(ray_file),
    }
    assert token_source(env) == ("from-env", "RAY_AUTH_TOKEN")
    del env["RAY_AUTH_TOKEN"]
    assert token_source(env)[0] == "from-pdm-file"
    del env["PDM_RAY_TOKEN_FILE"]
    assert token_source(env)[0] == "from-ray-path"
    assert token_source({})[0] == "from-default"
    with pytest.raises(TokenUnreadable, match="PDM_RAY_TOKEN_FILE: cannot read"):
        token_source({"PDM_RAY_TOKEN_FILE": str(tmp_path / "missing")})
    assert scrub("a from-env b", {"RAY_AUTH_TOKEN": "from-env"}) == "a *** b"


class _JobApi(BaseHTTPRequestHandler):
    """Answers /api/version as Ray's dashboard does, with or without token authentication."""

    token: str | None = None

    def do_GET(self):  # noqa: N802 (http.server's name)
        given = self.headers.get("Authorization")
        if self.token is None or given == f"Bearer {self.token}":
            code = 200
        else:
            code = 401 if given is None else 403
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def job_api():
    servers = []

    def serve(token: str | None) -> str:
        handler = type("Api", (_JobApi,), {"token": token})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_an_open_job_api_is_refused_unless_insecure_and_gets_no_token(job_api):
    address = job_api(None)
    (problem,) = auth_problems(address, env={"RAY_AUTH_TOKEN": "t0ken-value"})
    assert "without authentication" in problem.message and "--insecure" in problem.message
    assert auth_problems(address, insecure=True, env={}) == []
    assert headers_for(address, env={"RAY_AUTH_TOKEN": "t0ken-value"}) == {}


def test_a_token_is_required_checked_and_never_shown(job_api, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # a local ray.init() may have left ~/.ray/auth_token
    address = job_api("right-token-value")
    (missing,) = auth_problems(address, env={})
    assert "none is set" in missing.message
    (wrong,) = auth_problems(address, env={"RAY_AUTH_TOKEN": "wrong-token-value"})
    assert "refuses this token (HTTP 403)" in wrong.message
    assert "wrong-token-value" not in str(wrong)
    right = {"RAY_AUTH_TOKEN": "right-token-value"}
    assert auth_problems(address, env=right) == []
    assert headers_for(address, env=right) == {"Authorization": "Bearer right-token-value"}


def test_a_report_names_every_failed_check_with_its_node():
    ok, bad = {"ok": True, "detail": "fine"}, {"ok": False, "detail": "cannot write"}
    checks = {"tracking": ok, "checkpoints": bad, "data": ok, "models": ok, "versions": bad}
    node = NodeReport("ab12cd34ef", "node-2", "10.0.0.2", False, checks)
    report = ClusterReport("http://head:8265", [node])
    assert not report.ok
    assert [(p.file, p.field) for p in report.problems()] == [
        ("node node-2 10.0.0.2 ab12cd34 (worker)", "checkpoints"),
        ("node node-2 10.0.0.2 ab12cd34 (worker)", "versions"),
    ]
    assert not ClusterReport("http://head:8265", []).ok
