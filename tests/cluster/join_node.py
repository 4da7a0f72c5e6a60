"""``ray start`` for a second node of a cluster on this machine that stays on loopback.

Ray's single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) binds every server to
127.0.0.1 but makes ``ray start --address`` refuse to join; its cluster mode joins, but binds the
GCS, raylets and agents to every interface and rewrites 127.0.0.1 to the machine's address. This
runs Ray's own CLI with exactly that refusal lifted and the node address left as given; every
process it starts (raylet, agents, workers) reads the environment's single-machine mode and binds
to loopback, like the head's. Used by the tests only (``two_node.py``).
"""

from __future__ import annotations

import sys

import ray._private.ray_constants as ray_constants
import ray._private.services as services

services.resolve_ip_for_localhost = lambda host: host  # keep 127.0.0.1 as the node's address
ray_constants.ENABLE_RAY_CLUSTER = True  # only this process: lets `ray start --address` join

if __name__ == "__main__":
    from ray.scripts.scripts import main

    sys.argv = ["ray", *sys.argv[1:]]
    main()
