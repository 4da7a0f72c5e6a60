"""Matching metric names against a spec's pattern, across MLflow's name sanitising.

VeRL names its evaluation metrics ``val-core/<dataset>/acc/mean@16``; MLflow does not accept
``@`` in metric names, so the logger stores ``val-core/<dataset>/acc/mean_at_16``
(``pdmask.tracking.metric_names``). A pattern may be
written either way and matches both forms; its single ``*`` is one path segment, the dataset.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from pdmask.tracking.metric_names import sanitize_metric


def stored_pattern(pattern: str) -> str:
    """``pattern`` as the names it matches are stored (each part sanitised, ``*`` kept)."""
    return "*".join(sanitize_metric(part) for part in pattern.split("*"))


@lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    head, tail = stored_pattern(pattern).split("*", 1)
    return re.compile(f"{re.escape(head)}([^/]+){re.escape(tail)}")


def match_datasets(pattern: str, metric_names: Iterable[str]) -> dict[str, str]:
    """Map dataset name -> metric name for every metric matching ``pattern`` (sorted by dataset)."""
    regex = _compile(pattern)
    found: dict[str, str] = {}
    for name in metric_names:
        match = regex.fullmatch(sanitize_metric(name))
        if match:
            found.setdefault(match.group(1), name)
    return dict(sorted(found.items()))
