"""A loopback HTTP proxy in front of a real MLflow server that refuses the metric writes of chosen
runs, as a tracking server that is unavailable for a while would.

Everything else passes through unchanged (each request forwarded whole, its answer returned
whole), so a sweep pointed at ``uri`` runs as against the server itself. A refused write is a
``runs/log-batch`` carrying metrics, or a ``runs/log-metric``, naming a run of ``refused``: it
gets 503 with MLflow's error body, and is recorded (run, steps) in ``refusals``. Tags, params and
status updates of that run still pass: only its metrics are refused.
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from pdmask.loopback import LOOPBACK

METRIC_WRITES = ("/runs/log-batch", "/runs/log-metric")
# Headers of one hop, never forwarded (RFC 9110 7.6.1); lengths are set for the whole bodies.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
}
OWN_HEADERS = HOP_BY_HOP | {"server", "date"}  # the proxy's answer sends its own


class RefusingProxy:
    """``with RefusingProxy("http://127.0.0.1:PORT") as proxy:`` serves ``proxy.uri``."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.refused: set[str] = set()
        self.refusals: list[tuple[str, list[int]]] = []  # (run id, the steps refused)
        self.forwarded = 0
        self._lock = threading.Lock()

    def refuse(self, run_id: str) -> None:
        with self._lock:
            self.refused.add(run_id)

    def allow(self, run_id: str) -> None:
        with self._lock:
            self.refused.discard(run_id)

    @property
    def uri(self) -> str:
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def __enter__(self) -> RefusingProxy:
        proxy = self

        class Handler(_Forward):
            owner = proxy

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def refused_write(self, path: str, body: bytes) -> tuple[str, list[int]] | None:
        """(run id, steps) when this request is a metric write to refuse now."""
        if not path.split("?", 1)[0].endswith(METRIC_WRITES):
            return None
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            return None
        run_id = payload.get("run_id") or payload.get("run_uuid")
        metrics = payload.get("metrics", [payload] if "key" in payload else [])
        with self._lock:
            if run_id not in self.refused or not metrics:
                return None
            steps = sorted({int(m.get("step", 0)) for m in metrics})
            self.refusals.append((run_id, steps))
        return run_id, steps


class _Forward(BaseHTTPRequestHandler):
    owner: RefusingProxy
    protocol_version = "HTTP/1.1"  # keep-alive for MLflow's sessions: every answer has a length

    def log_message(self, *args) -> None:  # the sweep's requests are not the test's output
        pass

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding"):
            return self._answer(501, b'{"message": "the test proxy takes sized bodies only"}')
        body = self.rfile.read(length) if length else b""
        refused = self.owner.refused_write(self.path, body)
        if refused is not None:
            message = f"tracking server unavailable for run {refused[0]} (test fault)"
            error = {"error_code": "TEMPORARILY_UNAVAILABLE", "message": message}
            return self._answer(503, json.dumps(error).encode())
        up = self.owner.upstream
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=300)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in OWN_HEADERS]
        finally:
            conn.close()
        with self.owner._lock:
            self.owner.forwarded += 1
        self._answer(answer.status, data, kept)

    def _answer(self, status: int, data: bytes, headers=None) -> None:
        self.send_response(status)
        for key, value in headers or [("Content-Type", "application/json")]:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _relay
