"""``Launch.TUNE``: the trials trained by Ray Tune, one CPU each, on an embedded Ray or a cluster."""
