"""The local Ray head gets distinct ports, and a port taken between choosing and binding only
costs a retry.

A CI run failed once because ports chosen one at a time (each socket released before the next
was asked for) gave the dashboard and the client server the same number, and Ray refused to start.
"""

from __future__ import annotations

import socket
import urllib.request

import pytest

from pdmask.loopback import LOOPBACK, free_ports
from pdmask.orchestration.cluster import local_head as ray_jobs_local
from pdmask.orchestration.cluster.local_head import PORT_FLAGS, LocalRayHead, tree_of


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports:
        with socket.socket() as s:
            s.bind((LOOPBACK, port))


@pytest.mark.slow
@pytest.mark.processes
def test_a_head_handed_a_repeated_port_starts_again_with_fresh_ones(monkeypatch):
    calls = []

    def repeated_then_fresh(count: int, host: str = LOOPBACK) -> list[int]:
        ports = free_ports(count, host)
        calls.append(ports)
        if len(calls) == 1:  # what the old one-at-a-time choice could hand out
            ports[PORT_FLAGS.index("--ray-client-server-port")] = ports[
                PORT_FLAGS.index("--dashboard-port")
            ]
        return ports

    monkeypatch.setattr(ray_jobs_local, "free_ports", repeated_then_fresh)
    lines: list[str] = []
    with LocalRayHead(num_gpus=0, num_cpus=1, log=lines.append) as head:
        with urllib.request.urlopen(f"{head.address}/api/version", timeout=5) as answer:
            assert answer.status == 200
        pid = head.process.pid
    assert len(calls) == 2, lines
    assert any("retrying" in line for line in lines), lines
    assert not [p for p in tree_of(pid) if ray_jobs_local._alive(p)]  # nothing left running
