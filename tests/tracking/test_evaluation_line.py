"""The trial log's line per evaluation (``tracking/evaluation_line.py``): what ``pdm logs -f``
shows of a trial training. Pure; a real sweep's logs hold it in
``orchestration/test_trial_logs.py``, a real VeRL sweep's in ``verl_cpu/test_verl_sweep.py``."""

from __future__ import annotations

from pdmask.tracking.evaluation_line import evaluation_line
from pdmask.tracking.metric_names import ENTROPY, MASKED_SHARE

HEADLINE = "val-core/synth/acc/mean_at_16"


def test_a_trained_steps_evaluation_has_every_field():
    metrics = {HEADLINE: 0.41251, MASKED_SHARE: 0.0312, ENTROPY: 1.23449, "other": 5.0}
    line = evaluation_line(10, 50, metrics, [HEADLINE], 0.8351)
    assert line == "step 10/50: avg@16 0.413, masked 3.12 %, entropy 1.234, 0.84 s/step"


def test_the_evaluation_before_training_has_the_headline_only_and_others_none():
    assert evaluation_line(0, 50, {HEADLINE: 0.1}, [HEADLINE], None) == "step 0/50: avg@16 0.100"
    assert evaluation_line(3, 50, {MASKED_SHARE: 0.1}, [HEADLINE], 1.0) is None  # not evaluated
    assert evaluation_line(3, 0, {HEADLINE: 0.5}, [], 1.0) is None  # no headline known
    # a total not known: the step alone; verl's mean@2 of the tiny CPU profile labelled so
    tiny = "val-core/aime24/acc/mean_at_2"
    assert evaluation_line(3, 0, {tiny: 0.5}, [tiny], None) == "step 3: avg@2 0.500"


def test_several_datasets_show_their_mean_as_the_figures_plot_it():
    aime = {"val-core/aime24/acc/mean_at_16": 0.25, "val-core/aime25/acc/mean_at_16": 0.5}
    assert evaluation_line(5, 10, aime, sorted(aime), None) == "step 5/10: avg@16 0.375"
