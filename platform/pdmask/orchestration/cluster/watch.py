"""A sweep whose Ray cluster is gone ends within a bound, resumable, instead of waiting forever.

When a raylet dies (killed, out of memory, its node removed), Tune keeps looping on "Cluster
resources not detected" with its trials' processes orphaned, and no signal short of a third
Ctrl-C ends the sweep. ``ClusterWatch`` is a Tune callback that looks at the cluster every
``CHECK_EVERY_S`` from Tune's own loop and raises ``ClusterLost`` when

- no node has been alive for ``NO_NODE_S`` (Ray notices a dead raylet after about 20 s of
  missed health checks), or
- the live nodes have had no CPU for ``NO_CPU_S`` (every node that can run a trial is gone; a
  cluster that adds CPU nodes on demand gets that long to add one).

The runner ends the sweep on it: runs left RUNNING become KILLED, exit 1 with one line, and the
same command resumes every trial from its checkpoint once a cluster is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ray.tune import Callback

from pdmask.errors import ClusterLost

CHECK_EVERY_S = 5.0
NO_NODE_S = 10.0
NO_CPU_S = 120.0


def cluster_state() -> tuple[int, float]:
    """(alive nodes, CPUs among them), as the driver's GCS connection sees them."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    return len(alive), sum(float(n.get("Resources", {}).get("CPU", 0)) for n in alive)


class ClusterWatch(Callback):
    def __init__(
        self,
        state: Callable[[], tuple[int, float]] = cluster_state,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.state = state
        self.clock = clock
        self._checked = float("-inf")
        self._no_node_since: float | None = None
        self._no_cpu_since: float | None = None

    def __getstate__(self):  # Tune pickles its callbacks; the probes are this process's
        return {}

    def __setstate__(self, state):
        self.__init__()

    def on_step_begin(self, iteration, trials, **info):
        now = self.clock()
        if now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        reason = self.lost(now)
        if reason:
            raise ClusterLost(reason)

    def lost(self, now: float) -> str | None:
        """Why the cluster counts as lost at ``now``, or None."""
        try:
            nodes, cpus = self.state()
        except Exception:  # the GCS itself unreachable: as good as no node
            nodes, cpus = 0, 0.0
        self._no_node_since = _since(self._no_node_since, now) if nodes == 0 else None
        self._no_cpu_since = _since(self._no_cpu_since, now) if cpus <= 0 else None
        if self._no_node_since is not None and now - self._no_node_since >= NO_NODE_S:
            return (
                f"the Ray cluster has no live node (for {now - self._no_node_since:.0f} s): its "
                "raylet died or its node was removed"
            )
        if self._no_cpu_since is not None and now - self._no_cpu_since >= NO_CPU_S:
            return (
                f"the Ray cluster has had no CPU to run a trial for {now - self._no_cpu_since:.0f} s "
                f"({nodes} live node(s) without CPUs)"
            )
        return None


def _since(start: float | None, now: float) -> float:
    return now if start is None else start
