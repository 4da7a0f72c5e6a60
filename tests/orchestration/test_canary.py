"""The canary and fail-fast gate against a real sqlite MLflow store: which trial may start when,
what stops a setting, and how the end of the sweep counts and says it (no Ray: the launchers'
use of the gate is held by tests/library's sweeps)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pdmask.orchestration.canary import TRAINING_METRIC, SettingGate
from pdmask.registry import load_registry
from pdmask.tracking import TrialRun, ensure_experiment, open_client, runs_by_hash
from pdmask.tracking.runs import exception_kind
from tests.orchestration.conftest import ROOT

EVAL = "val-core/synth/acc/mean_at_16"
pytestmark = pytest.mark.processes  # a real sqlite store, nothing computed in-process


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module (creating a sqlite store takes seconds): each test its own
    experiment."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDM_HOME", str(home))
        yield open_client(f"sqlite:///{home / 'mlflow.db'}")


@pytest.fixture
def grid(store, request):
    """Two settings of main-figure, two seeds each, in the plan's order, and an experiment."""
    trials = load_registry(ROOT).expand("main-figure")
    cells: dict[str, list] = {}
    for trial in trials:
        if len(cells) < 2 or trial.cell_hash in cells:
            cells.setdefault(trial.cell_hash, []).append(trial)
    picked = [t for seeds in cells.values() for t in seeds[:2]]
    picked.sort(key=trials.index)
    return picked, ensure_experiment(store, request.node.name)


def _gate(store, experiment, trials, said=None):
    return SettingGate.of(
        trials,
        trials,
        runs_by_hash(store, experiment),
        lambda: runs_by_hash(store, experiment),
        [EVAL],
        (said if said is not None else []).append,
    )


def _run(store, experiment, trial) -> TrialRun:
    return TrialRun.start_or_resume(store, experiment, trial, {}, log_params=False)


def test_every_canary_launches_first_and_its_siblings_wait_for_its_first_step(store, grid):
    trials, experiment = grid
    gate = _gate(store, experiment, trials)
    canaries = [t for t in gate.order if gate.is_canary(t)]
    assert len(canaries) == 2 and gate.order[:2] == canaries
    assert {t.cell_hash for t in canaries} == {t.cell_hash for t in trials}
    sibling = next(t for t in trials if t not in canaries and t.cell_hash == canaries[0].cell_hash)
    assert [gate.admissible(t) for t in canaries] == [True, True]
    assert not gate.admissible(sibling)
    assert "2 other trial(s)" in gate.plan_line()
    run = _run(store, experiment, canaries[0])
    run.log(0, {EVAL: 0.1})  # the validation before training: not yet
    gate.refresh(force=True)
    assert not gate.admissible(sibling)
    run.log(1, {TRAINING_METRIC: 0.3})  # its first training step: the setting is proven
    gate.refresh(force=True)
    assert gate.admissible(sibling) and not gate.is_canary(sibling)


def test_a_deterministic_failure_stops_its_setting_once_and_says_so(store, grid):
    trials, experiment = grid
    said: list[str] = []
    gate = _gate(store, experiment, trials, said)
    canary = gate.order[1]
    sibling = next(t for t in trials if t.cell_hash == canary.cell_hash and t != canary)
    dropped: list[list[str]] = []
    gate.on_stop.append(dropped.append)
    gate.start(canary)
    reason = "ImportError: No module named 'flash_attn'\nTraceback ..."
    kind = _run(store, experiment, canary).fail(reason, kind=exception_kind(reason))
    assert kind == "import" and kind.deterministic
    gate.end(canary.trial_hash)
    assert gate.is_stopped(sibling) and not gate.admissible(sibling)
    assert not gate.is_stopped(gate.order[0])  # the other setting goes on
    assert gate.not_started() == {sibling.trial_hash} and dropped == [[sibling.trial_hash]]
    (stopped,) = gate.stopped_settings()
    assert stopped["setting"] == canary.cell_name() and stopped["kind"] == "import"
    assert stopped["error"] == "ImportError: No module named 'flash_attn'"
    assert stopped["trial"] == canary.run_name() and stopped["not_started"] == 1
    assert len(said) == 1 and said[0].startswith(f"setting {canary.cell_name()} stopped: Import")
    gate.refresh(force=True)
    assert len(said) == 1, "a stopped setting is stopped once"


def test_the_same_crash_twice_is_deterministic_a_different_one_is_not(store, grid):
    trials, experiment = grid
    first = _run(store, experiment, trials[0])
    assert first.fail("RuntimeError: CUDA error at 0x7f3a9c00 in /tmp/x/y.py:12") == "crash"
    again = _run(store, experiment, trials[0])  # attempt 2: the same error, other numbers
    assert again.fail("RuntimeError: CUDA error at 0x7f3aa100 in /tmp/z/y.py:13") == "repeated"
    other = _run(store, experiment, trials[1])
    assert other.fail("RuntimeError: one thing") == "crash"
    other = _run(store, experiment, trials[1])
    assert other.fail("ValueError: another") == "crash"
    stalled = _run(store, experiment, trials[2])
    assert stalled.fail("stalled: no step for 130 s", kind="stall") == "stall"
    stalled = _run(store, experiment, trials[2])
    assert stalled.fail("stalled: no step for 140 s", kind="stall") == "stall"  # can pass


def test_a_past_invocations_failure_does_not_stop_a_setting_a_new_one_does(store, grid):
    trials, experiment = grid
    canary = trials[0]
    _run(store, experiment, canary).fail("ModuleNotFoundError: No module named 'x'", kind="import")
    gate = _gate(store, experiment, trials)  # the next invocation: the user fixed the install
    assert gate.is_canary(canary)
    gate.refresh(force=True)
    assert not gate.is_stopped(canary)
    _run(store, experiment, canary).fail("ModuleNotFoundError: No module named 'x'", kind="import")
    gate.refresh(force=True)
    assert gate.is_stopped(canary)


def test_a_proven_setting_is_open_and_a_resumed_trial_is_the_canary(store, grid):
    trials, experiment = grid
    first, second = (t for t in trials if t.cell_hash == trials[0].cell_hash)
    run = _run(store, experiment, first)
    run.log(0, {EVAL: 0.1})
    run.log(1, {TRAINING_METRIC: 0.2})
    run.interrupted()
    resumed = next(t for t in trials if t.cell_hash != first.cell_hash and t.seed != 0)
    _run(store, experiment, resumed).interrupted()  # started before, killed before its step
    gate = _gate(store, experiment, trials)
    assert gate.admissible(first) and gate.admissible(second)  # proven: nothing waits
    assert gate.is_canary(resumed)


def test_a_canary_that_ends_without_a_deterministic_failure_opens_its_setting(store, grid):
    trials, experiment = grid
    gate = _gate(store, experiment, trials)
    canary = gate.order[0]
    sibling = next(t for t in trials if t.cell_hash == canary.cell_hash and t != canary)
    _run(store, experiment, canary).fail("stalled: no step for 900 s", kind="stall")
    gate.refresh(force=True)
    assert not gate.admissible(sibling)  # a retry may still prove it
    gate.end(canary.trial_hash)  # out of retries: the fault can pass, its siblings may try
    assert gate.admissible(sibling) and not gate.is_stopped(sibling)


def test_the_end_of_the_sweep_counts_and_names_a_stopped_setting(store, grid):
    from pdmask.orchestration.options import SweepOptions
    from pdmask.orchestration.report import print_summary
    from pdmask.orchestration.session import SweepSession

    trials, experiment = grid
    reg = load_registry(ROOT)
    out = io.StringIO()
    session = SweepSession(
        reg=reg,
        sweep=reg.sweep("main-figure"),
        trials=trials,
        options=SweepOptions(),
        client=store,
        uri="sqlite:///x.db",
        experiment_id=experiment,
        tags={},
        console=Console(file=out, width=300),
        interrupts=None,
        started=0.0,
    )
    todo = session.todo()
    canary = session.gate.order[0]
    session.gate.start(canary)
    _run(store, experiment, canary).fail("ImportError: No module named 'flash_attn'", kind="import")
    session.gate.end(canary.trial_hash)
    for trial in trials:
        if trial.cell_hash != canary.cell_hash:
            run = _run(store, experiment, trial)
            run.log(1, {TRAINING_METRIC: 0.5})
            run.finish()
    outcome = session.settle(todo.skipped)
    assert (outcome.finished, outcome.failed, outcome.not_started) == (2, 1, 1)
    assert outcome.interrupted == 0 and outcome.exit_code == 1
    print_summary(session.console, session.sweep, outcome, session.uri)
    text = out.getvalue()
    assert "not started (their setting was stopped)" in text
    stopped = [line for line in text.splitlines() if line.startswith("stopped setting")]
    assert len(stopped) == 1 and "ImportError: No module named 'flash_attn'" in stopped[0]
