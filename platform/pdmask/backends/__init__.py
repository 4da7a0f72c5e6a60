"""Training backends. ``pdmask.backends.dispatch.run_backend`` trains one trial in-process.

- ``sim``: the embedded CPU trainer (this machine, a laptop, a Ray worker).
- ``verl``: VeRL jobs on a GPU cluster, submitted as Ray Jobs (``pdmask.backends.verl``).

This package file stays import-light: verl imports ``pdmask.backends.verl.rewards`` in every
reward worker.
"""
