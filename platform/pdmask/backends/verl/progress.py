"""The trial log's line per evaluation on VeRL, written by pdmask inside verl's trainer.

verl's trainer logs each step's metrics through its ``Tracking``: one ``log(data, step)`` per
step, the validation's metrics merged into the step that validated, the validation before
training alone at step 0. pdmask's trainer adds one backend to that ``Tracking``
(:func:`install`), which prints the line of ``tracking/evaluation_line.py`` (the embedded
backend's, one formatter) for each step whose metrics hold the core validation accuracy, from the
metrics verl computed: the headline, the masked share, the entropy and the mean of verl's
``timing_s/step`` over the steps since the previous validation. It prints to the job's stdout,
which the job's driver log holds and the sweep appends to the trial's log.
"""

from __future__ import annotations

import numbers

from pdmask.tracking.evaluation_line import evaluation_line
from pdmask.tracking.metric_names import is_core_accuracy, sanitize_metric

LOGGER_KEY = "pdm-evaluation-lines"  # its name among verl's Tracking backends
STEP_TIME = "timing_s/step"  # verl's wall time of a training step (its marked_timer "step")


class EvaluationLines:
    """A verl ``Tracking`` backend that prints an evaluation line at each validation."""

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self.step_times: list[float] = []  # since the previous validation

    def log(self, data: dict, step: int) -> None:
        metrics = {
            sanitize_metric(key): float(value)
            for key, value in data.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)
        }
        if STEP_TIME in metrics:
            self.step_times.append(metrics[STEP_TIME])
        headlines = sorted(key for key in metrics if is_core_accuracy(key))
        rate = sum(self.step_times) / len(self.step_times) if self.step_times else None
        line = evaluation_line(step, self.total_steps, metrics, headlines, rate)
        if line is not None:
            print(line, flush=True)
            self.step_times.clear()

    def finish(self) -> None:  # nothing buffered
        pass


def install(tracking, total_steps: int) -> None:
    """Add :class:`EvaluationLines` to verl's ``Tracking`` (once)."""
    if LOGGER_KEY not in tracking.logger:
        tracking.logger[LOGGER_KEY] = EvaluationLines(total_steps)
