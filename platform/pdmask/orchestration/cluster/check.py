"""`pdm cluster check`: prove, from every alive node of a cluster, what its jobs need there.

Settings can look right on the submitting machine and still be wrong where the jobs run: a
tracking server behind a firewall, a checkpoint root that is a local disk on each node, data
copied to one node only, a half-downloaded model, another pdmask commit on the image, a driver
too old for the CUDA the wheels are built for, no flash-attn. The check submits one small Ray job
(``probe.py`` and its siblings, shipped as its working directory, so it needs nothing on
the cluster but Ray) whose driver runs a zero-CPU task pinned to every alive node, and reads the
per-node results back from the job's log. ``pdm sweep`` to a cluster address runs it before the
first submission (``--skip-cluster-check`` skips it, explicitly).

What the nodes are checked against comes from the backend (``JobBatch.node_inputs``: paths, the
packages it pins, what a training node needs) and from this machine: pdmask's own version and
source digest, and the version of any package the backend leaves unpinned (None). A package
neither pins nor has here must be the same on every node. ``CheckSpec`` is a plain dataclass, so
a test can expect another version and see the mismatch caught, which one machine's single
install cannot show otherwise.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdmask.errors import ConfigError, Problem

# The job's start on a busy head, plus ROUND_TIMEOUT_S for each of its rounds (the probes, the
# share seen from each node, the clean-up, the all-reduce's master, the all-reduce).
CHECK_TIMEOUT_S = 600.0
POLL_S = 0.3
SUBMISSION_PREFIX = "pdmcheck-"
QUIET_LOGGERS = (
    "ray.dashboard.modules.dashboard_sdk",
    "ray._private.runtime_env.packaging",
)  # not "pdm-": never mistaken for a sweep's trial job


def expected_versions(pins: dict[str, str | None]) -> dict[str, str | None]:
    """Each package's expected version: its pin, else this machine's install (pdmask's with its
    source digest), else None (then the nodes must agree with each other)."""
    from pdmask.orchestration.cluster.probe import node_version

    return {name: want if want is not None else node_version(name) for name, want in pins.items()}


def submitter_versions() -> dict[str, str | None]:
    """pdmask as installed here, with the digest of its sources."""
    return expected_versions({"pdmask": None})


@dataclass(frozen=True)
class CheckSpec:
    """What every node checks; paths as the nodes see them.

    ``checkpoint_need_bytes``: what the sweep writes to the checkpoint share at its peak (None:
    not checked), ``checkpoint_written``: its folder under the root (what is there counts);
    ``hub_models``: the Hub ids the jobs download (no model root); ``hub_endpoint``: None for
    each node's own ``HF_ENDPOINT`` or the Hub; ``versions``: expected on every node;
    ``training``: what a node with the training resource must have (``backends/verl/
    node_requirements.py: training_nodes``; None: no training-node checks)."""

    tracking_uri: str
    checkpoint_root: str | None
    data_files: tuple[str, ...] = ()
    model_root: str | None = None
    model_paths: tuple[str, ...] = ()
    versions: dict[str, str | None] = field(default_factory=submitter_versions)
    checkpoint_need_bytes: int | None = None
    checkpoint_written: str | None = None
    hub_models: tuple[str, ...] = ()
    hub_endpoint: str | None = None
    training: dict[str, Any] | None = None

    @classmethod
    def of(cls, tracking_uri: str, inputs: dict[str, Any], **overrides) -> CheckSpec:
        """From a backend's ``node_inputs`` (``backends/verl/site_inputs.py``); the keys past
        ``model_paths`` are optional."""
        training = inputs.get("training")
        if training is not None:
            training = {**training, "packages": expected_versions(training["packages"])}
        fields = {
            "tracking_uri": tracking_uri,
            "checkpoint_root": inputs["checkpoint_root"],
            "data_files": tuple(inputs["data_files"]),
            "model_root": inputs["model_root"],
            "model_paths": tuple(inputs["model_paths"]),
            "versions": expected_versions({"pdmask": None, **inputs.get("versions", {})}),
            "checkpoint_need_bytes": inputs.get("checkpoint_need_bytes"),
            "checkpoint_written": inputs.get("checkpoint_written"),
            "hub_models": tuple(inputs.get("hub_models", ())),
            "training": training,
        }
        return cls(**{**fields, **overrides})


@dataclass(frozen=True)
class NodeReport:
    node_id: str
    host: str
    ip: str
    head: bool
    checks: dict[str, dict[str, Any]]  # check -> {"ok": bool, "detail": str}

    @property
    def name(self) -> str:
        role = "head" if self.head else "worker"
        return f"{self.host} {self.ip} {self.node_id[:8]} ({role})"

    def failed(self) -> list[str]:
        return [c for c, r in self.checks.items() if not r["ok"]]


@dataclass(frozen=True)
class ClusterReport:
    address: str
    nodes: list[NodeReport]

    @property
    def ok(self) -> bool:
        return bool(self.nodes) and not any(n.failed() for n in self.nodes)

    def problems(self) -> list[Problem]:
        """Every failed check as a problem naming its node, the check and the fix."""
        out = [
            Problem(f"node {n.name}", check, _with_fix(n.checks[check]))
            for n in self.nodes
            for check in n.failed()
        ]
        if not self.nodes:
            out.append(Problem(f"cluster {self.address}", "nodes", "no alive node answered"))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "ok": self.ok, "nodes": [asdict(n) for n in self.nodes]}


def _with_fix(check: dict[str, Any]) -> str:
    return f"{check['detail']}. Fix: {check['fix']}" if check.get("fix") else check["detail"]


def run_check(address: str, spec: CheckSpec, timeout_s: float = CHECK_TIMEOUT_S) -> ClusterReport:
    """Run the check job on the cluster at ``address`` (its job API) and return every node's
    results; raises ConfigError when the job itself cannot run (its log's tail says why)."""
    from ray.job_submission import JobSubmissionClient

    from pdmask.orchestration.cluster import probe as cluster_probe
    from pdmask.orchestration.cluster.auth import headers_for, scrub

    for name in QUIET_LOGGERS:  # their INFO lines ("Uploading package ...") are not news here
        logging.getLogger(name).setLevel(logging.WARNING)
    folder = Path(tempfile.mkdtemp(prefix="pdm-cluster-check-"))
    try:
        for name in cluster_probe.FILES:
            shutil.copy(Path(cluster_probe.__file__).with_name(name), folder / name)
        payload = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()}
        (folder / cluster_probe.SPEC_FILE).write_text(json.dumps(payload))
        try:
            client = JobSubmissionClient(address, headers=headers_for(address))
            sid = client.submit_job(
                entrypoint="python3 probe.py",
                submission_id=f"{SUBMISSION_PREFIX}{uuid.uuid4().hex[:12]}",
                runtime_env={"working_dir": str(folder)},
                metadata={"pdm.purpose": "pdm cluster check"},
            )
        except Exception as err:  # refused, unreachable, version mismatch
            raise ConfigError(
                f"--address {address}: cannot submit the cluster check job: {scrub(str(err))}"
            ) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        status = _wait(client, sid, timeout_s)
        log = client.get_job_logs(sid)
    finally:
        _forget(client, sid)
    line = next((x for x in log.splitlines() if x.startswith(cluster_probe.MARK)), None)
    if line is None:
        tail = "\n".join(log.rstrip().splitlines()[-20:])
        raise ConfigError(
            f"the cluster check job on {address} ended {status} without a result "
            f"(is Ray's `python3` on the head the one with Ray installed?); its log's end:\n"
            f"{scrub(tail)}"
        )
    nodes = json.loads(line[len(cluster_probe.MARK) :])["nodes"]
    return ClusterReport(
        address,
        [
            NodeReport(
                node_id=n["node_id"],
                host=n.get("host", "?"),
                ip=n.get("ip", ""),
                head=bool(n.get("head")),
                checks={c: n[c] for c in cluster_probe.CHECKS},
            )
            for n in sorted(nodes, key=lambda n: (not n.get("head"), n["node_id"]))
        ],
    )


def _wait(client, sid: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.get_job_status(sid)
        if status.is_terminal():
            return str(status.value)
        if time.monotonic() > deadline:
            client.stop_job(sid)
            raise ConfigError(
                f"the cluster check job {sid} did not finish within {timeout_s:.0f} s "
                f"(still {status.value}): are the cluster's nodes busy or starting?"
            )
        time.sleep(POLL_S)


def _forget(client, sid: str, tries: int = 20) -> None:
    """The check job is removed from the cluster's job list once read (best effort: the head
    may still be closing the job's supervisor for a moment after the job ended)."""
    for _ in range(tries):
        try:
            if client.delete_job(sid):
                return
        except Exception:
            pass
        time.sleep(POLL_S)


def render(report: ClusterReport, console) -> None:
    """The per-node table, then one line per failed check naming node and check."""
    from pdmask.console import PIPED_WIDTH, table
    from pdmask.orchestration.cluster.probe import CHECKS
    from pdmask.tracking.store import redact

    rows = [
        [n.host, n.ip, n.node_id[:8], "head" if n.head else "worker"]
        + [("ok" if n.checks[c]["ok"] else "FAILED") for c in CHECKS]
        for n in report.nodes
    ]
    title = f"cluster {report.address}: {len(report.nodes)} alive node(s)"
    shown = table(title, ["node", "ip", "id", "role", *CHECKS], rows)
    if not console.is_terminal:  # never cut to an assumed width (a sweep's console: 80 columns)
        from rich.console import Console

        wide = Console(file=io.StringIO(), width=PIPED_WIDTH, highlight=False)
        wide.print(shown)
        shown = wide.file.getvalue().rstrip()
    console.print(shown, soft_wrap=True, markup=False)
    first = report.nodes[0] if report.nodes else None
    if first is not None:
        for check in CHECKS:
            if first.checks[check]["ok"]:
                console.print(f"  {check}: {redact(first.checks[check]['detail'])}", soft_wrap=True)
    for problem in report.problems():
        console.print(f"[red]FAILED[/red] {redact(str(problem))}", soft_wrap=True)
    if report.ok:
        console.print(f"every check passed on all {len(report.nodes)} node(s)")
