"""When the cluster watch declares a sweep's Ray cluster lost, on a fake clock and cluster."""

from __future__ import annotations

import pytest

from pdmask.errors import ClusterLost
from pdmask.orchestration.cluster.watch import CHECK_EVERY_S, NO_CPU_S, NO_NODE_S, ClusterWatch


class World:
    def __init__(self):
        self.now = 0.0
        self.nodes, self.cpus = 1, 2.0

    def clock(self) -> float:
        return self.now

    def state(self):
        if self.nodes is None:
            raise ConnectionError("GCS unreachable")
        return self.nodes, self.cpus


def _watch(world: World) -> ClusterWatch:
    return ClusterWatch(state=world.state, clock=world.clock)


def test_no_live_node_for_its_bound_is_lost_and_a_node_back_in_time_is_not():
    world = World()
    watch = _watch(world)
    watch.on_step_begin(0, [])
    world.nodes, world.cpus = 0, 0.0
    world.now += CHECK_EVERY_S
    watch.on_step_begin(1, [])  # lost from now on
    world.now += NO_NODE_S - 1
    assert watch.lost(world.now) is None
    world.nodes, world.cpus = 1, 2.0  # the node came back: the count starts again
    assert watch.lost(world.now) is None
    world.nodes, world.cpus = 0, 0.0
    world.now += 1
    assert watch.lost(world.now) is None
    world.now += NO_NODE_S
    with pytest.raises(ClusterLost, match="no live node"):
        watch.on_step_begin(2, [])


def test_an_unreachable_gcs_counts_as_no_node():
    world = World()
    watch = _watch(world)
    world.nodes = None
    assert watch.lost(world.now) is None
    world.now += NO_NODE_S
    assert "no live node" in watch.lost(world.now)


def test_live_nodes_without_cpus_get_longer_before_the_sweep_ends():
    world = World()
    watch = _watch(world)
    world.cpus = 0.0
    assert watch.lost(world.now) is None
    world.now += NO_NODE_S
    assert watch.lost(world.now) is None  # a CPU node may still be added
    world.now += NO_CPU_S
    assert "no CPU" in watch.lost(world.now)


def test_it_looks_at_most_every_few_seconds():
    world = World()
    calls = []
    watch = ClusterWatch(state=lambda: calls.append(1) or (1, 2.0), clock=world.clock)
    for _ in range(100):
        watch.on_step_begin(0, [])
    world.now += CHECK_EVERY_S
    watch.on_step_begin(0, [])
    assert len(calls) == 2
