"""MLflow tracking: the store, one run per trial, provenance, and the UI.

Contract (design.md): experiment = sweep name; one run per trial tagged ``pdm.*`` (trial hash,
method, model, precision, delta, seed, backend, git SHA + dirty flag, package versions); params;
per-step metrics; ``trial.json`` (the resolved config) as an artifact; status FINISHED, or FAILED
with ``pdm.failure_reason`` and the history of failures in ``pdm.failures``.
"""

from pdmask.tracking.metric_names import sanitize_metric
from pdmask.tracking.provenance import provenance_tags
from pdmask.tracking.runs import TrialRun, runs_by_hash, summarize_status
from pdmask.tracking.status import TrialStatusIndex
from pdmask.tracking.store import ensure_experiment, open_client, resolve_tracking_uri

__all__ = [
    "TrialRun",
    "TrialStatusIndex",
    "ensure_experiment",
    "open_client",
    "provenance_tags",
    "resolve_tracking_uri",
    "runs_by_hash",
    "sanitize_metric",
    "summarize_status",
]
