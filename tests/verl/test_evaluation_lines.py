"""A VeRL trial's line per validation (``backends/verl/progress.py``): verl's real ``Tracking``
given a step's metrics as verl's trainer logs them (verl's names, ``@`` unsanitised), prints the
embedded backend's line (``tracking/evaluation_line.py``). A real VeRL sweep's trial log holds it
in ``verl_cpu/test_verl_sweep.py``."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

from verl.utils.tracking import Tracking  # noqa: E402

from pdmask.backends.verl import progress  # noqa: E402
from pdmask.tracking.evaluation_line import evaluation_line  # noqa: E402

CORE = "val-core/tiny/acc/mean@2"  # the tiny CPU profile's headline, as verl names it


def _trained(step_time: float) -> dict:
    """A training step's metrics, as verl logs them (numpy scalars among them)."""
    return {
        "actor/pdm/masked_frac": np.float32(0.0125),
        "actor/entropy": 1.5,
        "timing_s/step": step_time,
        "training/global_step": 1,
        "val-aux/tiny/acc/best@2/mean": 0.75,  # not the headline: verl's auxiliary files
    }


def test_each_validation_step_prints_the_embedded_backends_line(capsys):
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=[])
    progress.install(tracking, total_steps=4)
    progress.install(tracking, total_steps=4)  # once: a second call adds nothing
    assert list(tracking.logger) == [progress.LOGGER_KEY]

    tracking.log(data={CORE: 0.25, "val-aux/tiny/acc/best@2/mean": 0.5}, step=0)
    tracking.log(data=_trained(2.0), step=1)  # no validation: no line
    tracking.log(data={**_trained(4.0), CORE: np.float64(0.5)}, step=2)
    tracking.log(data={**_trained(3.0), CORE: 0.625}, step=4)
    lines = capsys.readouterr().out.splitlines()

    assert lines == [
        "step 0/4: avg@2 0.250",
        "step 2/4: avg@2 0.500, masked 1.25 %, entropy 1.500, 3.00 s/step",  # (2 + 4) / 2
        "step 4/4: avg@2 0.625, masked 1.25 %, entropy 1.500, 3.00 s/step",
    ]
    # the embedded backend's formatter, given the stored names: one format for both backends
    stored = {
        "val-core/tiny/acc/mean_at_2": 0.5,
        "actor/pdm/masked_frac": 0.0125,
        "actor/entropy": 1.5,
    }
    assert lines[1] == evaluation_line(2, 4, stored, ["val-core/tiny/acc/mean_at_2"], 3.0)


def test_several_datasets_show_their_mean_and_an_unknown_total_the_step_alone(capsys):
    aime = {"val-core/aime24/acc/mean@16": 0.25, "val-core/aime25/acc/mean@16": 0.5}
    progress.EvaluationLines(total_steps=0).log(aime, step=50)
    assert capsys.readouterr().out == "step 50: avg@16 0.375\n"


def test_pdmasks_trainer_adds_it_when_verl_starts_tracking(capsys):
    """verl's trainer creates its ``Tracking`` in fit(); pdmask's trainer adds the lines at its
    first hook (``_start_tracking``), before verl logs the validation before training."""
    from omegaconf import OmegaConf

    from pdmask.backends.verl.trainer import PDMTrainerSync

    trainer = PDMTrainerSync.__new__(PDMTrainerSync)  # only what _start_tracking reads
    trainer.config = OmegaConf.create({"trainer": {"logger": ["console"]}})  # no MLflow
    trainer.logger = Tracking(project_name="p", experiment_name="e", default_backend=[])
    trainer.total_training_steps = 3
    trainer._start_tracking()
    trainer.logger.log(data={CORE: 0.5}, step=0)
    assert capsys.readouterr().out == "step 0/3: avg@2 0.500\n"
