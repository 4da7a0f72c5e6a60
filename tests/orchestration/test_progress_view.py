"""The sweep's progress and end summary as printed: a 60-trial sweep in a 30-row terminal, the
heartbeat off a terminal (on a fake clock), mean ± sd per setting, the driver's log file."""

from __future__ import annotations

import io
import logging
import math
import re
from types import SimpleNamespace

from rich.console import Console

from pdmask.orchestration.driver_logs import DRIVER_LOG, routed
from pdmask.orchestration.eta import Row
from pdmask.orchestration.progress_view import view
from pdmask.orchestration.report import print_summary as _summary
from pdmask.orchestration.session import SweepOutcome
from pdmask.orchestration.summary import results_by_setting
from pdmask.orchestration.tune.progress import HEARTBEAT_S, Phase, SweepProgress

METRICS = ["val-core/a/acc/mean_at_16", "val-core/b/acc/mean_at_16"]


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _trial(i: int):
    return SimpleNamespace(trial_id=f"t{i:02d}", config={})


def _report(progress, i: int, **result):
    progress.on_trial_result(0, [], _trial(i), {"pdm_trial_hash": f"h{i:02d}", **result})


def _sweep(n: int, console: Console, clock: Clock, **kw) -> SweepProgress:
    names = {f"h{i:02d}": f"trial-{i:02d}" for i in range(n)}
    return SweepProgress(names, console, sweep="big", clock=clock, live=False, **kw)


def _start(progress, i: int, clock: Clock, steps: int = 0) -> None:
    progress.on_trial_start(0, [], _trial(i))
    _report(progress, i, pdm_step=0, pdm_total_steps=100)
    if steps:
        clock.now += 1
        _report(progress, i, pdm_step=steps, pdm_total_steps=100)


def test_a_60_trial_sweep_in_30_rows_shows_the_header_and_every_running_trial():
    clock = Clock()
    console = Console(record=True, height=30, width=100)
    progress = _sweep(60, console, clock, slots=8)
    for i in range(20):  # done
        _start(progress, i, clock)
        _report(progress, i, pdm_outcome="finished", pdm_eval=0.5)
    for i in range(20, 22):  # failed
        _start(progress, i, clock)
        _report(progress, i, pdm_outcome="config-error", pdm_error="bad delta")
    for i in range(22, 30):  # running, rates known
        _start(progress, i, clock, steps=10)
    console.export_text(clear=True)  # the event lines; the view alone from here
    console.print(progress.render())
    lines = console.export_text().rstrip("\n").splitlines()
    assert len(lines) <= 30, lines
    assert lines[0].startswith("big: 20/60 done, 8 running, 2 failed, 30 queued; elapsed")
    assert "ETA —" not in lines[0]  # known from the finished trials and the rates
    text = "\n".join(lines)
    for i in range(22, 30):
        assert f"trial-{i:02d}" in text, text
    assert "trial-20" in text and "config error" in text  # failed right after running
    assert "queued: 30" in text and "more done" in text, text  # queued: one line
    assert not any(f"trial-{i:02d}" in text for i in range(30, 60))
    running = [ln for ln in lines if " running " in ln and ln.strip().startswith("trial-")]
    assert len(running) == 8 and lines.index(running[0]) < lines.index(
        next(ln for ln in lines if "config error" in ln)
    )


def test_more_running_trials_than_rows_are_cut_with_a_count():
    clock = Clock()
    console = Console(record=True, height=30, width=100)
    progress = _sweep(60, console, clock)
    for i in range(40):
        _start(progress, i, clock)
    console.export_text(clear=True)
    console.print(progress.render())
    lines = console.export_text().rstrip("\n").splitlines()
    assert len(lines) <= 30, lines
    assert "ETA —" in lines[0]  # no trial has a rate yet
    assert any("more running" in ln for ln in lines) and any("queued: 20" in ln for ln in lines)


def test_off_a_terminal_a_heartbeat_with_the_counts_and_eta_every_heartbeat_interval():
    clock = Clock(0.0)
    out = io.StringIO()
    progress = _sweep(4, Console(file=out, width=200), clock)  # not a terminal: lines
    assert progress.live is None

    def beats() -> list[str]:
        return [ln for ln in out.getvalue().splitlines() if " queued; elapsed " in ln]

    progress.on_step_begin(0, [])  # Tune's loop starts: the first one at once
    assert len(beats()) == 1 and beats()[0].endswith(
        "0/4 done, 0 running, 0 failed, 4 queued; elapsed 0s, ETA —"
    )
    progress.on_trial_start(0, [], _trial(0))  # started at t=0
    clock.now = 10.0
    _report(progress, 0, pdm_step=0, pdm_total_steps=100)  # first step after 10 s
    clock.now = 20.0
    _report(progress, 0, pdm_step=10, pdm_total_steps=100)  # 1 s a step
    for t in (20.0, HEARTBEAT_S - 1):  # no trial reports: Tune still calls on_step_begin
        clock.now = t
        progress.on_step_begin(0, [])
    assert len(beats()) == 1
    clock.now = HEARTBEAT_S
    progress.on_step_begin(0, [])
    assert len(beats()) == 2
    # at t=45 the running trial's rate is 3.5 s a step (35 s since its first step, 10 steps):
    # 90 steps left, 315 s; a queued trial takes its 10 s of start-up plus 100 steps at that
    # rate (360 s), one after the other on the one slot: 315 + 3 x 360 = 1395 s
    assert beats()[1].endswith("0/4 done, 1 running, 0 failed, 3 queued; elapsed 45s, ETA 23m15s")
    clock.now = 2 * HEARTBEAT_S + 1
    progress.on_step_begin(0, [])
    assert len(beats()) == 3
    assert "started (attempt 1)" in out.getvalue()  # the trial events are still lines


def test_on_a_terminal_under_ci_the_heartbeat_lines_replace_the_live_table(monkeypatch):
    """A CI runner often gives its job a terminal whose output is a log: CI=true turns the live
    table (redrawn in place, unreadable in a log) into the heartbeat lines."""
    names = {"h00": "trial-00"}

    def progress_on_a_terminal(out: io.StringIO) -> SweepProgress:
        console = Console(file=out, width=200, force_terminal=True)
        assert console.is_terminal
        return SweepProgress(names, console, sweep="ci", clock=Clock(0.0))

    monkeypatch.setenv("CI", "true")
    out = io.StringIO()
    progress = progress_on_a_terminal(out)
    assert progress.live is None
    progress.on_step_begin(0, [])
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # a terminal's colours
    assert "ci: 0/1 done, 0 running, 0 failed, 1 queued; elapsed 0s" in text, text
    progress.close()
    monkeypatch.delenv("CI")
    live = progress_on_a_terminal(io.StringIO())
    try:
        assert live.live is not None  # a person's terminal: the live table
    finally:
        live.close()


def _rows_of_a_main_figure_sweep(now: float) -> list[Row]:
    """72 trials a quarter of an hour in: 4 running, 1 failed, 34 finished one a minute apart
    (trial-00 first), the other 33 queued (Tune pends two of them already)."""
    rows = [
        Row(name=f"trial-{i:02d}", trial_hash=f"h{i:02d}", state="done", step=50, total=50,
            eval=0.5 + i / 100, started=60.0 * i, finished_at=60.0 * i + 90.0)
        for i in range(34)
    ]  # fmt: skip
    rows += [
        Row(name=f"trial-{i:02d}", state="running", step=25, total=50, started=now - 50,
            first_step_at=now - 40, first_step=5)
        for i in range(34, 38)
    ]  # fmt: skip
    rows.append(Row(name="trial-38", state="failed", step=3, total=50, started=now - 80))
    rows += [Row(name=f"trial-{i:02d}", state="pending") for i in (39, 40)]
    return rows


def test_queued_trials_are_one_line_and_the_latest_results_fill_the_rest():
    """The live display of a 72-trial sweep at any terminal height: every running trial (its
    time left), the failed one, then the latest finished trials with their headline and the time
    they took, and the 33 queued trials as one line; never more lines than the terminal has."""
    now = 34 * 60.0
    rows = _rows_of_a_main_figure_sweep(now)
    for height in (42, 24, 16):
        console = Console(record=True, height=height, width=100)
        console.print(view("main-figure", rows, total=72, elapsed=now, now=now, eta=None,
                           height=height))  # fmt: skip
        lines = console.export_text().rstrip("\n").splitlines()
        assert len(lines) <= height, (height, lines)
        assert "34/72 done, 4 running, 1 failed, 33 queued" in lines[0]
        (queued,) = [ln for ln in lines if "queued: " in ln]
        assert queued.split() == ["queued:", "33"]
        assert not any(f"trial-{i}" in ln for ln in lines for i in range(39, 72))
        trial_rows = [ln.split() for ln in lines if ln.lstrip().startswith("trial-")]
        assert [r[0] for r in trial_rows[:5]] == [*(f"trial-{i}" for i in range(34, 39))]
        assert all(r[-2:] == ["50s", "left"] for r in trial_rows[:4])  # 2 s a step, 25 left
        finished = trial_rows[5:]
        assert finished, lines  # the room left goes to results, newest first
        for k, row in enumerate(finished):
            i = 33 - k
            assert row == [f"trial-{i:02d}", "done", "50/50", f"{0.5 + i / 100:.3f}", "1m30s"]
        (more,) = [ln for ln in lines if "more done" in ln]
        assert more.split()[1] == str(34 - len(finished))


def test_a_phase_says_what_it_does_then_how_long_it_took():
    clock = Clock(0.0)
    console = Console(record=True, width=100)
    with Phase(console, "starting Ray", "Ray started", clock=clock):
        clock.now = 12.4
    assert console.export_text().splitlines() == ["starting Ray…", "Ray started (12s)"]


def _run(method: str, seed: int, values: tuple[float, float] | None, status="FINISHED", **tags):
    metrics = {} if values is None else dict(zip(METRICS, values, strict=True))
    return SimpleNamespace(
        info=SimpleNamespace(status=status, run_id=f"{method}-{seed}"),
        data=SimpleNamespace(
            metrics=metrics,
            tags={
                "pdm.method": method,
                "pdm.model": "qwen3-4b-base",
                "pdm.precision": "bf16",
                "pdm.delta": "0.15",
                "mlflow.runName": f"{method}-s{seed}",
                **tags,
            },
        ),
    )


def test_the_summary_gives_each_setting_mean_and_sd_over_seeds_and_each_failure():
    # final value of a run: the mean of its datasets' metrics
    runs = [
        _run("pdm-agg", 0, (0.1, 0.3)),  # 0.2
        _run("pdm-agg", 1, (0.4, 0.4)),  # 0.4
        _run("pdm-agg", 2, (0.8, 1.0)),  # 0.9
        _run("dppo-topk-kl", 0, (0.25, 0.35)),  # 0.3, one seed
        _run(
            "dppo-topk-kl",
            1,
            None,
            status="FAILED",
            **{"pdm.failure_reason": "RuntimeError: loss is NaN\nTraceback ..."},
        ),  # fmt: skip
    ]
    results = {r["setting"]: r for r in results_by_setting(runs, METRICS)}
    assert set(results) == {"pdm-agg", "dppo-topk-kl"}  # the other axes do not vary: not shown
    agg = results["pdm-agg"]
    assert agg["n"] == 3 and math.isclose(agg["mean"], 0.5)
    # by hand: deviations -0.3, -0.1, 0.4; (0.09 + 0.01 + 0.16) / (3 - 1) = 0.13
    assert math.isclose(agg["sd"], math.sqrt(0.13))
    assert results["dppo-topk-kl"]["n"] == 1 and results["dppo-topk-kl"]["sd"] is None

    from pdmask.orchestration.session import concluded as _concluded

    outcome = _concluded(SweepOutcome(4, 1, 0, 0, elsewhere=2), runs, METRICS, started=None)
    outcome.wall_s = 83.0
    console = Console(record=True, width=400)  # a deep state folder's path stays on its line
    sweep = SimpleNamespace(name="demo", search=None)
    _summary(console, sweep, outcome, "sqlite:///x.db")
    text = console.export_text()
    assert "sweep demo: summary, wall time 1m23s" in text
    elsewhere = next(ln for ln in text.splitlines() if "another invocation" in ln)
    assert elsewhere.split()[-1] == "2", elsewhere
    rows = [ln.strip() for ln in text.splitlines()]
    agg_line = next(ln for ln in rows if ln.startswith("pdm-agg"))
    assert agg_line.split()[1:] == ["3", "0.500", "±", "0.361"], agg_line
    dppo_line = next(ln for ln in rows if ln.startswith("dppo-topk-kl"))
    assert dppo_line.split()[1:] == ["1", "0.300"], dppo_line
    failed = [ln for ln in text.splitlines() if ln.startswith("failed ")]
    assert failed == [
        "failed dppo-topk-kl-s1: RuntimeError: loss is NaN (its log: `pdm logs dppo-topk-kl-s1`)"
    ], failed
    logs = next(ln for ln in text.splitlines() if ln.startswith("trial logs: "))
    assert logs.endswith("logs/demo (`pdm logs RUN` prints one)"), logs
    assert "final avg@16 per setting" in text


def test_the_summary_names_the_headline_by_its_sample_count():
    from pdmask.orchestration.progress_view import HEADLINE_LABEL, headline_label

    assert headline_label(METRICS) == "avg@16"
    assert headline_label(["val-core/synth/acc/mean_at_2"]) == "avg@2"  # the tiny VeRL profile
    assert headline_label(["val-core/a/acc/mean_at_2", "val-core/b/acc/mean_at_16"]) == (
        HEADLINE_LABEL
    )
    assert headline_label(["eval/score"]) == HEADLINE_LABEL


def test_lr0_controls_are_a_row_of_their_own_never_seeds_of_the_trained_method():
    """main-figure's lr = 0 controls share method, model, precision and delta with the trained
    dppo-topk-kl trials: grouped by those alone, a control's ~0.1 was averaged into the method's
    ~0.8 (one row, n = 4, 0.468 ± 0.396). A run's label tag says what it is; a run logged before
    runs carried one is told apart by its knob tags."""
    from pdmask.registry import load_registry

    reg = load_registry()
    trials = reg.expand("main-figure")
    control = next(t for t in trials if t.sim.get("lr") == 0)
    trained = next(t for t in trials if t.method == control.method and not t.sim)
    assert control.tags()["pdm.method_label"] == f"{control.method} (lr = 0 mismatch control)"
    assert trained.tags()["pdm.method_label"] == trained.method
    label = control.tags()["pdm.method_label"]
    runs = [
        _run("dppo-topk-kl", 0, (0.8, 0.8), **{"pdm.method_label": "dppo-topk-kl"}),
        _run("dppo-topk-kl", 1, (0.82, 0.82), **{"pdm.method_label": "dppo-topk-kl"}),
        _run("dppo-topk-kl", 2, (0.13, 0.13), **{"pdm.method_label": label, "pdm.sim.lr": "0.0"}),
        _run("dppo-topk-kl", 3, (0.12, 0.12), **{"pdm.sim.lr": "0.0"}),  # before the label tag
    ]
    results = {r["setting"]: r for r in results_by_setting(runs, METRICS)}
    assert set(results) == {"dppo-topk-kl", label}
    assert results["dppo-topk-kl"]["n"] == 2 and math.isclose(results["dppo-topk-kl"]["mean"], 0.81)
    assert results[label]["n"] == 2 and math.isclose(results[label]["mean"], 0.125)


def test_a_search_summary_keeps_its_best_trial_and_the_elsewhere_count():
    best = {"value": 0.42, "run_id": "r9", "run_name": "pdm-agg-s0", "delta": "0.1"}
    outcome = SweepOutcome(0, 0, 3, 0, elsewhere=1, best=best)
    console = Console(record=True, width=120)
    sweep = SimpleNamespace(
        name="s", search=SimpleNamespace(metric="val-core/synth/acc/mean_at_16")
    )
    _summary(console, sweep, outcome, "sqlite:///x.db")
    text = console.export_text()
    row = next(ln for ln in text.splitlines() if "another invocation" in ln)
    assert row.split()[-1] == "1", row
    assert "best trial: pdm-agg-s0 (val-core/synth/acc/mean_at_16 = 0.4200, delta = 0.1" in text


def test_library_logs_go_to_the_driver_log_not_the_console(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("PDM_HOME", str(tmp_path))
    monkeypatch.delenv("PDM_DEBUG", raising=False)
    before = list(logging.getLogger("mlflow").handlers)
    with routed("demo") as path:
        logging.getLogger("mlflow.store").warning("a migration line")
        logging.getLogger("ray.tune").warning("a tune line")
        logging.getLogger("optuna").warning("a study line")
    assert path == tmp_path / "logs" / "demo" / DRIVER_LOG
    text = path.read_text()
    assert "a migration line" in text and "a tune line" in text and "a study line" in text
    out, err = capfd.readouterr()
    assert "line" not in out + err, out + err
    assert logging.getLogger("mlflow").handlers == before  # put back after the sweep


def test_a_driver_log_that_cannot_be_written_drops_the_line_quietly(tmp_path, monkeypatch, capfd):
    import shutil

    monkeypatch.setenv("PDM_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("PDM_DEBUG", raising=False)
    with routed("demo") as path:
        shutil.rmtree(path.parent)  # the state folder deleted mid-sweep
        logging.getLogger("ray").warning("nowhere to go")
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Logging error" not in err and "nowhere" not in err, err


def test_a_state_folder_that_cannot_exist_leaves_the_lines_dropped_not_an_error(monkeypatch):
    monkeypatch.setenv("PDM_HOME", "/dev/null/state")  # the store's check reports it, once
    with routed("demo") as path:
        logging.getLogger("mlflow").warning("dropped")
    assert path is None


def test_a_search_counts_its_points_not_sampled_yet_as_queued():
    clock = Clock()
    console = Console(record=True, height=30, width=100)
    progress = SweepProgress({}, console, sweep="search", total=5, clock=clock, live=False)
    progress.on_trial_start(0, [], _trial(0))
    _report(progress, 0, pdm_step=0, pdm_total_steps=100)
    console.export_text(clear=True)
    console.print(progress.render())
    text = console.export_text()
    assert "search: 0/5 done, 1 running, 0 failed, 4 queued" in text
    assert "queued: 4" in text, text


def test_a_full_disk_under_the_driver_log_raises_nothing_at_its_last_flush():
    from pdmask.orchestration.driver_logs import _QuietFileHandler

    handler = _QuietFileHandler("/dev/full")  # every write that reaches it: ENOSPC
    handler.emit(logging.LogRecord("ray", logging.WARNING, __file__, 1, "a line", (), None))
    handler.close()  # the sweep's own error (the disk is full, naming the folder) stays the one


def test_the_main_figures_summary_is_a_methods_by_settings_table_that_fits_80_columns():
    """Six method labels (the lr = 0 control among them) x four settings x three seeds, as the
    main figure ends: at 80 columns every setting's column and every mean ± sd (n) is there
    (the text wraps), and GRPO, which has no delta, ends in no dangling delta."""
    from pdmask.orchestration.session import concluded as _concluded

    settings = [
        ("qwen3-4b-base", "bf16"),
        ("qwen3-8b-base", "bf16"),
        ("qwen3-30b-a3b-base", "fp8-e2e"),
        ("qwen3-30b-a3b-base", "fp8-rollout"),
    ]
    labels = ["grpo-clip-higher", "dppo-topk-kl", "dppo-topk-kl (lr = 0 mismatch control)",
              "pdm-agg", "pdm-uni", "pdm-gram"]  # fmt: skip
    runs, expected = [], []
    for m, label in enumerate(labels):
        for c, (model, precision) in enumerate(settings):
            values = [0.1 * m + 0.01 * c + 0.001 * seed for seed in range(3)]  # sd 0.001
            expected.append(f"{sum(values) / 3:.3f}")
            tags = {"pdm.method_label": label, "pdm.model": model, "pdm.precision": precision}
            if label.startswith("grpo"):
                tags["pdm.delta"] = ""
            runs += [_run(label.split()[0], s, (v, v), **tags) for s, v in enumerate(values)]
    outcome = _concluded(SweepOutcome(72, 0, 0, 0), runs, METRICS, started=None)
    assert {r["cell"] for r in outcome.results} == {" ".join(s) for s in settings}
    assert not [r for r in outcome.results if "δ" in r["setting"]]  # one delta: not shown
    console = Console(record=True, width=80)
    _summary(console, SimpleNamespace(name="main-figure", search=None), outcome, "sqlite:///x")
    text = console.export_text()
    table = text[text.index("methods x settings") : text.index("avg@16: the mean")]
    assert max(len(line) for line in table.splitlines()) <= 80, table
    words = table.split()
    for value in expected:  # every cell's mean, its ± 0.001 and its n
        assert value in words, (value, table)
    assert words.count("±") == 24 and words.count("(3)") == 24, table
    for _model, precision in settings:  # the header wraps the model names, never drops one
        assert precision in words, table
