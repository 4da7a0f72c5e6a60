"""How a metric name is stored in MLflow: the one sanitiser every writer and reader uses.

MLflow refuses ``@`` and a few other characters in metric keys; verl's MLflow adapter writes
``val-core/<dataset>/acc/mean@16`` as ``val-core/<dataset>/acc/mean_at_16``. pdmask's loggers
write keys exactly as verl's adapter does, and figures look them up the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

_UNSAFE = re.compile(r"[^/\w.\- :]")


def sanitize_metric(name: str) -> str:
    """MLflow-safe metric key, exactly as verl's MLflow adapter writes it (``@`` -> ``_at_``)."""
    return _UNSAFE.sub("_", re.sub(r"//+", "/", name.replace("@", "_at_")))


HEADLINE_PATTERN = "val-core/*/acc/mean_at_16"
"""The headline metric, one per dataset (``*``): the figures' default y value, the runs table's
first column, ``pdm runs``' headline (VeRL's ``val-core/<dataset>/acc/mean@16``, as stored)."""
_HEAD, _TAIL = HEADLINE_PATTERN.split("*")


HEADLINE_LABEL = "avg@16"  # the headline metric's short name (tables, log lines)
SAMPLES = re.compile(r"mean_at_(\d+)$")  # verl's mean@N, as MLflow names it


def headline_label(metrics: list[str]) -> str:
    """``avg@N`` when every headline metric is a ``.../mean_at_N`` of one N (verl's names; the
    tiny CPU profile samples 2), else ``HEADLINE_LABEL``."""
    samples = {m.group(1) if (m := SAMPLES.search(name)) else None for name in metrics}
    if len(samples) == 1 and None not in samples:
        return f"avg@{samples.pop()}"
    return HEADLINE_LABEL


def is_headline(name: str) -> bool:
    """Whether a stored metric name is the headline metric of some dataset."""
    return (
        name.startswith(_HEAD)
        and name.endswith(_TAIL)
        and "/" not in name[len(_HEAD) : -len(_TAIL)]
    )


_CORE_ACCURACY = re.compile(r"^val-core/[^/]+/acc/mean_at_\d+$")


def is_core_accuracy(name: str) -> bool:
    """Whether a stored metric name is verl's core validation accuracy of a dataset,
    ``val-core/<dataset>/acc/mean@<n>`` at the job's sample count: its headline metric, whatever
    its n (16 for the paper, 2 on the tiny CPU profile; verl files the other n under val-aux)."""
    return bool(_CORE_ACCURACY.match(name))


# Training diagnostics every backend logs under one name (design.md's metrics contract)
MASKED_SHARE = "actor/pdm/masked_frac"  # share of the step's tokens the mask zeroed
ENTROPY = "actor/entropy"  # mean token entropy of the policy (verl's name)


# A pattern (a figure's metric, `pdmask.history`'s) may be written with `@` or as stored; its
# single `*` is one path segment, the dataset, and it matches both forms of a name.
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
