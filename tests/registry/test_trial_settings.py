"""The sweep's trial settings (``profile``, ``steps``): each does what it says on every backend
that has a meaning for it, is refused at plan time naming its field where it has none, and stays
out of the identity of a backend's trials that it cannot change."""

from __future__ import annotations

import pytest

from pdmask.backends.interface import planned_steps
from pdmask.backends.sim.backend import BACKEND as SIM_RUNTIME
from pdmask.backends.sim.backend import sim_config
from pdmask.backends.sim.specs import PROFILES
from pdmask.backends.verl.backend import BACKEND as VERL_RUNTIME
from pdmask.errors import ValidationFailed
from pdmask.registry import load_registry
from pdmask.registry.backends import (
    BackendSpec,
    Launch,
    Occupies,
    register_backend,
    unregister_backend,
)
from pdmask.registry.plan import DEFAULT_VERL_STEPS
from pdmask.tracking.runs import run_params

SWEEP = """\
name: {name}
description: settings
backend: {backend}
seeds: 1
{settings}
grid:
  method: [pdm-agg]
  model: [qwen3-4b-base]
  precision: [bf16]
  delta: [0.15]
"""


def _unloadable(name: str, summary: str) -> BackendSpec:
    """A backend spec whose runtime no process can import, and which reads no trial setting."""
    return BackendSpec(
        name=name,
        summary=summary,
        runtime="nowhere:BACKEND",
        supplies=frozenset({"behaviour_topk"}),
        mu_sources=("rollout",),
        launch=Launch.TUNE,
        occupies=Occupies.ONE_CPU,
    )


def _write(project, name: str, settings: str = "", backend: str = "sim") -> None:
    text = SWEEP.format(name=name, backend=backend, settings=settings)
    (project / "sweeps" / f"{name}.yaml").write_text(text)


def test_steps_set_the_embedded_backends_step_count_and_its_recorded_param(project):
    _write(project, "hundred", "steps: 100")
    (trial,) = load_registry(project).expand("hundred")
    assert trial.steps == 100
    assert sim_config(trial).resolved().steps == 100 == SIM_RUNTIME.planned_steps(trial)
    assert run_params(trial, SIM_RUNTIME.planned_steps(trial))["steps"] == "100"


def test_without_steps_the_profile_decides_and_the_param_says_so(project):
    _write(project, "budget", "profile: smoke")
    (trial,) = load_registry(project).expand("budget")
    assert trial.steps is None and trial.profile == "smoke"
    planned = SIM_RUNTIME.planned_steps(trial)
    assert planned == PROFILES["smoke"].steps
    assert run_params(trial, planned)["steps"] == str(planned)


def test_steps_change_the_identity_on_the_embedded_backend(project):
    _write(project, "a", "steps: 10")
    _write(project, "b", "steps: 20")
    reg = load_registry(project)
    (a,), (b,) = reg.expand("a"), reg.expand("b")
    assert a.trial_hash != b.trial_hash


def test_verl_trials_train_the_sweeps_steps_and_carry_no_profile(project):
    _write(project, "jobs", "steps: 7", backend="verl")
    _write(project, "default-jobs", backend="verl")
    reg = load_registry(project)
    (trial,) = reg.expand("jobs")
    assert trial.profile is None and VERL_RUNTIME.planned_steps(trial) == 7
    assert run_params(trial, 7)["steps"] == "7" and run_params(trial, 7)["profile"] == ""
    (default,) = reg.expand("default-jobs")
    assert VERL_RUNTIME.planned_steps(default) == DEFAULT_VERL_STEPS
    # the main figure plans whole on VeRL: it names no embedded-only setting
    assert {t.profile for t in reg.expand("main-figure", backend="verl")} == {None}


def test_a_profile_on_a_backend_without_profiles_is_refused_naming_the_field(project):
    _write(project, "jobs", "profile: full", backend="verl")
    with pytest.raises(ValidationFailed) as err:
        load_registry(project).expand("jobs")
    (problem,) = err.value.problems
    assert problem.field == "profile" and problem.file.endswith("jobs.yaml")
    assert problem.line == 5 and "no budget profiles" in problem.message
    _write(project, "plain", backend="verl")
    with pytest.raises(ValidationFailed) as err:
        load_registry(project).expand("plain", profile="smoke")
    assert [(p.file, p.field) for p in err.value.problems] == [("--profile", "profile")]


def test_steps_on_a_backend_that_does_not_read_them_are_refused(project):
    spec = _unloadable("fixed-budget", "a backend whose trials train a budget of their own")
    register_backend(spec)
    try:
        _write(project, "fixed", "steps: 100", backend="fixed-budget")
        with pytest.raises(ValidationFailed) as err:
            load_registry(project).expand("fixed")
        (problem,) = err.value.problems
        assert problem.field == "steps" and "does not train a set number of steps" in (
            problem.message
        )
    finally:
        unregister_backend("fixed-budget")


def test_planned_steps_is_none_where_the_backend_cannot_say(project):
    """The one question both launch kinds ask before a run starts: a backend that cannot be
    loaded here answers None (the trial's own attempt then fails with the reason) instead of
    ending the sweep; a loadable one answers with its own count."""
    _write(project, "plain")
    (trial,) = load_registry(project).expand("plain")
    assert planned_steps(trial) == SIM_RUNTIME.planned_steps(trial) == PROFILES[trial.profile].steps
    unloadable = _unloadable("not-installed", "a backend whose runtime is missing here")
    assert planned_steps(trial, unloadable) is None
