"""pdmask: trust-region masks for LLM RL.

The library entry point (``pdmask.api``), for scripts and notebooks::

    import pdmask
    pdmask.run_sweep("smoke", pdmask.SweepOptions(profile="smoke"))
    pdmask.runs("smoke")        # its runs: a pandas DataFrame, one row per run
    pdmask.history("smoke", metric="actor/entropy")  # a metric per run and step (long format)
"""

__version__ = "0.1.0"

_LAZY = {
    "run_sweep": "pdmask.api",
    "runs": "pdmask.api",
    "history": "pdmask.api",
    "SweepResult": "pdmask.api",
    "SweepOptions": "pdmask.api",
}
__all__ = ["SweepOptions", "SweepResult", "__version__", "history", "run_sweep", "runs"]


def __getattr__(name: str):
    # Imported on first use: `import pdmask` (and so every `pdm` command) stays light.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pdmask' has no attribute {name!r}")
