"""The suite's own Ray head is as well-behaved as pdm's: loopback only, and nothing outlives it.

The head every cluster test uses (``conftest.ray_head_process``) runs with fake GPUs next to other
engineers' Ray instances; an orphaned raylet or a socket on every interface would be the suite
leaking what pdm itself must not.
"""

from __future__ import annotations

import time

import pytest

from tests.orchestration.procs import Watch, listeners

from .conftest import ray_head_process

pytestmark = [pytest.mark.slow, pytest.mark.processes]


def test_the_tests_ray_head_listens_only_on_loopback_and_leaves_no_process():
    with ray_head_process() as head:
        watch = Watch(head.process.pid)
        time.sleep(3)  # the dashboard's agents start after the Jobs API answers
        watch.look()
        found = listeners(watch.alive())
    watch.stop()
    assert len(watch.seen) >= 3, "the watch saw no Ray processes: it checks nothing"
    assert found, "the head listens nowhere: the listener scan saw nothing"
    beyond = [
        f"{x.command} {x.protocol} {x.address}:{x.port}" for x in found if not x.loopback_only
    ]
    assert not beyond, beyond
    deadline = time.time() + 15
    while time.time() < deadline and watch.alive():
        time.sleep(0.2)
    assert not watch.alive(), "processes of the head outlived it"
