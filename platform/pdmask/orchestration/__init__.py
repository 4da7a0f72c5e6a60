"""Orchestration: run a sweep's trials on Ray (embedded or a cluster), resume, retry, report.

- ``runner.run_sweep``: the head and the tail of every invocation, once (``pdmask.api`` calls it);
- ``session.py``: the invocation's session, skip-finished, settling, the outcome;
- ``launcher.py``: the ``Launcher`` contract, and each launch kind's, loaded lazily:
  ``tune/`` (Ray Tune trials) and ``jobs/`` (Ray jobs on a cluster);
- ``cluster/``: the Ray plumbing both kinds and `pdm cluster` share (address, token, embedded
  instance and reaper, local head, watch, shared storage, the per-node check);
- beside them what every kind uses: the per-invocation options, the checks before launch
  (``preflight.py``), claims, trial logs and work folders, the driver's log routing, interrupts,
  the summary and the progress view, and what `pdm clean` may remove (``cleanup.py``).

Nothing here is imported by ``import pdmask.orchestration``: `pdm validate` and the reaper import
parts of this package and must not pay for Ray Tune and MLflow, which only running a sweep needs.
"""
