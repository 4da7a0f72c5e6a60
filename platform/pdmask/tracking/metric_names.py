"""How a metric name is stored in MLflow: the one sanitiser every writer and reader uses.

MLflow refuses ``@`` and a few other characters in metric keys; verl's MLflow adapter writes
``val-core/<dataset>/acc/mean@16`` as ``val-core/<dataset>/acc/mean_at_16``. pdmask's loggers
write keys exactly as verl's adapter does, and figures look them up the same way.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^/\w.\- :]")


def sanitize_metric(name: str) -> str:
    """MLflow-safe metric key, exactly as verl's MLflow adapter writes it (``@`` -> ``_at_``)."""
    return _UNSAFE.sub("_", re.sub(r"//+", "/", name.replace("@", "_at_")))
