"""The line a trial's log gets at each evaluation, on every backend: what ``pdm logs -f`` shows
of a trial training.

    step 10/50: avg@16 0.412, masked 3.10 %, entropy 1.234, 0.84 s/step

One formatter for both writers: the embedded backend's Tune trial prints it from the metrics it
reports (``orchestration/tune/trainable.py``), a VeRL job's trainer from the metrics verl logs
at a validation step (``backends/verl/progress.py``). Metric names are as stored
(``sanitize_metric``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdmask.tracking.metric_names import ENTROPY, MASKED_SHARE, headline_label


def evaluation_line(
    step: int,
    total: int,
    metrics: dict[str, float],
    headlines: Sequence[str],
    seconds_per_step: float | None,
) -> str | None:
    """The log's line for a step that evaluated (None: none of ``headlines`` is among the step's
    ``metrics``): the step of ``total`` (0: not known), the headline metric (the mean over its
    datasets, as the figures plot it), the masked share and entropy where the step trained, and
    the seconds per step since the previous evaluation."""
    found = [h for h in headlines if h in metrics]
    if not found:
        return None
    value = sum(metrics[h] for h in found) / len(found)
    parts = [f"{headline_label(found)} {value:.3f}"]
    if MASKED_SHARE in metrics:
        parts.append(f"masked {100 * metrics[MASKED_SHARE]:.2f} %")
    if ENTROPY in metrics:
        parts.append(f"entropy {metrics[ENTROPY]:.3f}")
    if seconds_per_step is not None:
        parts.append(f"{seconds_per_step:.2f} s/step")
    return f"step {step}{f'/{total}' if total else ''}: " + ", ".join(parts)
