"""Training backends: the runtime half of each ``pdmask.registry.backends.BackendSpec``.

- ``interface``: the ``Backend`` protocols (check, plan, train in a Tune worker or build Ray Jobs)
  and ``load_backend(name)``.
- ``sim``: the embedded CPU trainer (this machine, a laptop, a Ray worker); runtime ``sim/backend.py``.
- ``verl``: VeRL jobs on a cluster, submitted as Ray Jobs; runtime ``verl/backend.py``.

This package file stays import-light: verl imports ``pdmask.backends.verl.rewards`` in every
reward worker.
"""
