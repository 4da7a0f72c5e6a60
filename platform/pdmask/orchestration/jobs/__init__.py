"""``Launch.RAY_JOBS``: each trial a Ray job on a cluster (or on a head pdm starts here)."""
