"""`pdm ui`: listens on loopback only, links each sweep's runs table and each setting's
comparison view (checked in a real headless Chromium), and leaves no process behind whether it is
stopped by SIGINT, SIGTERM or SIGKILL.

The browser test drives Debian's `chromium` with Playwright; without chromium it is skipped, unless
PDM_REQUIRE_BROWSER is set (CI installs chromium and sets it, so there it fails instead)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from pdmask.registry import load_registry
from pdmask.tracking.comparison_view import RUN_COLUMNS, settings_of
from pdmask.tracking.store import DESCRIPTION_TAG, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND
from pdmask.tracking.ui import runs_table_url
from pdmask.tracking.ui_app import TRAINING_WORKFLOW, WORKFLOW_KEY

from .conftest import pdm_process

pytestmark = [pytest.mark.slow, pytest.mark.processes]

LOOPBACK = {"127.0.0.1", "::1"}
START_S = 240  # the server migrates a new store first; on a loaded 2-core machine that is slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESCRIPTION = "a small sweep of the smoke profile, for the UI test"
HEADLINE = "val-core/synth/acc/mean_at_16"
# Sections MLflow would sort before the headline's ("actor" < "val-core"), as a training run logs.
OTHER_METRICS = ("actor/pdm/masked_frac", "actor/pg_loss")
RUN_DESCRIPTION = "a run of the UI test"


@pytest.fixture
def store(project):
    """The project's sqlite store with the smoke sweep's experiment and one finished run per trial."""
    from pdmask.tracking import ensure_experiment, open_client

    client = open_client()
    experiment_id = ensure_experiment(client, "smoke", DESCRIPTION)
    names = []
    for step, trial in enumerate(load_registry(project).expand("smoke")):
        tags = {**trial.tags(), DESCRIPTION_TAG: RUN_DESCRIPTION}
        run = client.create_run(experiment_id, run_name=trial.run_name(), tags=tags)
        for metric in (HEADLINE, *OTHER_METRICS):
            client.log_metric(run.info.run_id, metric, 0.25, step=step)
        client.set_terminated(run.info.run_id)
        names.append(trial.run_name())
    return client, experiment_id, names


PANEL = "4b-bf16"  # a setting of the main figure, added to the smoke experiment by `panel`
CONTROL = "(lr = 0 mismatch control)"


@pytest.fixture
def panel(project, store):
    """The store, plus the main figure's 4b-bf16 runs (seeds 0 and 1, the lr = 0 control among
    them) in the smoke experiment: a second setting, whose view groups two runs a method."""
    client, experiment_id, _ = store
    trials = [
        t for t in load_registry(project).expand("main-figure") if t.setting == PANEL and t.seed < 2
    ]
    for trial in trials:
        run = client.create_run(experiment_id, run_name=trial.run_name(), tags=trial.tags())
        for step in (0, 10):  # the seeds differ: each method's band has a width
            value = 0.15 + 0.01 * trial.seed + (0 if CONTROL in trial.method_label() else step / 20)
            client.log_metric(run.info.run_id, HEADLINE, value, step=step)
            client.log_metric(run.info.run_id, OTHER_METRICS[1], 0.1, step=step)
        client.set_terminated(run.info.run_id)
    return store, trials


def _start(
    project, *args: str, sigint_ignored: bool = False
) -> tuple[subprocess.Popen, str, list[str]]:
    """`pdm ui ARGS` in its own process; returns it, the UI's URL and the runs-table links.
    ``sigint_ignored``: started as a script's background job is (SIGINT inherited ignored)."""

    def ignore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = pdm_process(
        "ui",
        "--port",
        "0",
        *args,
        env={"PDM_PROJECT": str(project), "PDM_HOME": str(project / ".pdm")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=project,
        preexec_fn=ignore_sigint if sigint_ignored else None,
    )
    deadline, seen = time.time() + START_S, []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if line.startswith("MLflow UI:"):
            links = [proc.stdout.readline().strip() for _ in range(_link_lines(project, args))]
            return proc, line.split()[2], links
    proc.kill()
    raise AssertionError(f"pdm ui did not start:\n{''.join(seen)[-3000:]}")


def _link_lines(project, args) -> int:
    """The lines of links `pdm ui ARGS` prints: one per sweep and one per setting of each."""
    from pdmask.tracking import open_client

    client = open_client()
    shown = [e for e in client.search_experiments() if e.name != "Default"]
    shown = [e for e in shown if not args or e.name in args]
    return sum(1 + len(settings_of(client.search_runs([e.experiment_id]))) for e in shown)


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # is_running checks reuse
                alive.append(p)
    return alive


def _check_loopback_only(procs: list[psutil.Process], url: str) -> None:
    names = " ".join(" ".join(p.cmdline()) for p in procs)
    assert "mlflow server" in names and "--workers 1" in names
    listening = [
        c.laddr
        for p in _alive(procs)
        for c in p.net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert int(url.rsplit(":", 1)[1]) in {a.port for a in listening}, (url, listening)
    assert {a.ip for a in listening} <= LOOPBACK, listening


def _stop_and_check_nothing_left(proc: subprocess.Popen, procs, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
        deadline = time.time() + 60
        while _alive(procs) and time.time() < deadline:
            time.sleep(0.2)
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in _alive(procs)]
        assert not left, f"left running after {sig.name}: {left}"
        assert proc.wait(timeout=10) == (-signal.SIGKILL if sig == signal.SIGKILL else 0)
    finally:
        for p in _alive(procs):
            p.kill()


def test_sigint_stops_a_ui_started_with_sigint_ignored(project, store):
    proc, url, _ = _start(project, sigint_ignored=True)
    _stop_and_check_nothing_left(proc, _tree(proc.pid), signal.SIGINT)


# SIGINT (Ctrl-C) is checked at the end of the browser test, which needs a running UI as well.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_ui_listens_on_loopback_only_and_leaves_nothing_behind(project, store, sig):
    proc, url, _ = _start(project)
    procs = _tree(proc.pid)
    _check_loopback_only(procs, url)
    _stop_and_check_nothing_left(proc, procs, sig)


def _browser(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS[1:])  # headless


def _shown(page, texts: list[str], timeout_s: float = 60) -> list[str]:
    """The texts not on the page once it settled: the runs search answers last, so the page is
    read until every text is there or the time is up."""
    deadline = time.time() + timeout_s
    while True:
        content = page.content()
        missing = [t for t in texts if t not in content]
        if not missing or time.time() > deadline:
            return missing
        page.wait_for_timeout(500)


def _in_training_view(page) -> None:
    """MLflow's GenAI view names its pages "Evaluations" (its breadcrumb and sidebar); the
    training view's choice is what the browser keeps (ui_app.WORKFLOW_KEY)."""
    assert "Evaluations" not in page.content(), page.url
    stored = page.evaluate(f"localStorage.getItem({WORKFLOW_KEY!r})")
    assert stored == f'"{TRAINING_WORKFLOW}"', stored


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("PDM_REQUIRE_BROWSER"),
    reason="no chromium: `apt-get install chromium` (CI installs it)",
)
def test_ui_opens_the_runs_table_and_stays_on_training_runs(project, panel, tmp_path):
    """From `pdm ui`'s links through a click on a run and on Compare, in a real headless Chromium:
    the runs table shows the sweep's columns, a setting's comparison view shows that setting's
    runs grouped by method with the headline first, and no page flips into MLflow's GenAI view."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "PDM_REQUIRE_BROWSER is set and no chromium is installed"
    (client, experiment_id, run_names), panel_trials = panel
    experiment = client.get_experiment(experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    assert experiment.tags[DESCRIPTION_TAG] == DESCRIPTION
    proc, url, links = _start(project, "smoke")
    procs = _tree(proc.pid)
    try:
        _check_loopback_only(procs, url)
        link = runs_table_url(url, experiment_id)
        assert links[0] == f"smoke: {link}", links
        compared = dict(line.split(", by method: ") for line in links[1:])
        assert sorted(compared) == [f"{PANEL} delta 0.15", "4b-fp8-rollout delta 0.15"], links
        with sync_playwright() as pw:
            browser = _browser(pw)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(link)
            columns = [*RUN_COLUMNS, HEADLINE]
            missing = _shown(page, [*run_names, DESCRIPTION, *columns])
            assert not missing, (missing, page.content()[-3000:])
            headers = page.locator("[role=columnheader]").all_inner_texts()
            shown = [h for h in dict.fromkeys(headers) if h in columns]
            assert shown == [HEADLINE, *RUN_COLUMNS], headers  # the headline metric first
            _in_training_view(page)
            page.screenshot(path=tmp_path / "runs-table.png")

            page.get_by_text(run_names[0], exact=True).first.click()
            page.wait_for_url(f"**/experiments/{experiment_id}/runs/*")
            assert not _shown(page, ["About this run", run_names[0], RUN_DESCRIPTION])
            _in_training_view(page)
            page.screenshot(path=tmp_path / "run-page.png")
            page.get_by_role("tab", name="Model metrics").first.click()
            headline_section = HEADLINE.rsplit("/", 1)[0]
            sections = [headline_section, *(m.rsplit("/", 1)[0] for m in OTHER_METRICS)]
            assert not _shown(page, sections)
            text = page.locator("body").inner_text()
            order = sorted(sections, key=text.find)
            assert order[0] == headline_section, (order, text[:3000])  # the headline first
            _in_training_view(page)
            page.screenshot(path=tmp_path / "run-charts.png")

            page.goto(link)
            assert not _shown(page, run_names)
            page.locator(".ag-header-select-all .ag-checkbox-input-wrapper").first.click()
            page.get_by_role("button", name="Compare").first.click()
            page.wait_for_url("**/compare-runs?*")
            runs = len(run_names) + len(panel_trials)
            assert not _shown(page, [f"Comparing {runs} Runs", *run_names])
            _in_training_view(page)
            page.screenshot(path=tmp_path / "compare.png")

            _check_comparison_view(page, compared[f"{PANEL} delta 0.15"], panel_trials, run_names)
            page.screenshot(path=tmp_path / "comparison-table.png")
            browser.close()
    finally:
        _stop_and_check_nothing_left(proc, procs, signal.SIGINT)


def _check_comparison_view(page, link: str, trials, other_runs: list[str]) -> None:
    """The setting's link opens a Figure-1 panel: the headline's chart first with one line and
    band per method, every label whole in its legend (the control's too); its table groups the
    setting's runs (only those) by method label, the headline the first column."""
    labels = sorted({t.method_label() for t in trials})
    assert any(CONTROL in label for label in labels), labels
    page.goto(link)
    assert not _shown(page, ["Group by: pdm.method_label", HEADLINE, *labels]), page.url
    text = page.locator("body").inner_text()
    # the headline's chart section first (MLflow draws a section's charts when they scroll in)
    other = f"\n{OTHER_METRICS[1].split('/')[0]}\n"
    assert -1 < text.find(HEADLINE) < text.find(other), text[:3000]
    # plotly draws a band as a filled path: one a group, each group's min-max over its seeds
    bands = page.locator(".js-fill")
    deadline = time.time() + 60  # drawn once the metric histories have loaded
    while bands.count() < len(labels) and time.time() < deadline:
        page.wait_for_timeout(500)
    assert bands.count() >= len(labels), page.content()[-3000:]
    assert not page.evaluate(_LEGEND_CUT, [labels, HEADLINE]), "a label is cut in the legend"
    _in_training_view(page)
    # the table view of the same state: the first of the view switch's radio buttons (drawn as
    # icons over the inputs, which a click on the input itself reaches)
    page.get_by_role("radio").first.evaluate("radio => radio.click()")
    groups = [f"Group: {label}" for label in labels]
    names = [t.run_name() for t in trials]
    assert not _shown(page, [*groups, *names]), page.content()[-3000:]
    assert not [n for n in other_runs if n in page.content()], "another setting's run is shown"
    headers = page.locator("[role=columnheader]").all_inner_texts()
    columns = [h for h in dict.fromkeys(headers) if h in (HEADLINE, *RUN_COLUMNS)]
    # the headline, then the method label (the grid draws the columns that fit the window)
    assert len(columns) >= 2 and columns == [HEADLINE, *RUN_COLUMNS][: len(columns)], headers
    assert not page.evaluate(_CUT, labels), "a label is cut"


# The labels the headline chart's legend ("<label> (<metric>)") does not show whole; the runs
# list beside it, hidden, holds them too, in a few pixels.
_LEGEND_CUT = """([labels, metric]) => labels.filter(label => !Array.from(
    document.querySelectorAll('span')).some(e => e.children.length === 0
        && e.textContent === `${label} (${metric})`
        && e.getBoundingClientRect().width > 100 && e.scrollWidth <= e.clientWidth))"""
# The labels whose group name or method-label cell the table cuts (or does not show).
_CUT = """labels => labels.filter(label => {
    const shown = Array.from(document.querySelectorAll('span[title], .ag-cell'))
        .filter(e => e.getAttribute('title') === label || e.innerText === label);
    return shown.length < 2 || shown.some(e => e.scrollWidth > e.clientWidth);
})"""


def test_a_busy_port_is_refused_before_any_server_starts(project, store):
    """A second `pdm ui` on a taken port used to print links served by the other process (its
    store, not this one) and then exit 1 without a word."""
    import socket

    with socket.socket() as other:  # whoever holds the port: another UI, any server
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = pdm_process(
            "ui",
            "--port",
            str(port),
            env={"PDM_PROJECT": str(project), "PDM_HOME": str(project / ".pdm")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=project,
        )
        out = proc.communicate(timeout=START_S)[0]
    assert proc.returncode == 2, out
    assert f"port {port} on 127.0.0.1 is in use" in out and "--port 0" in out, out
    assert "MLflow UI:" not in out and "Traceback" not in out, out
    log = project / ".pdm" / "ui" / "mlflow-server.log"
    assert not log.exists() or "Listening" not in log.read_text(), "a server was started"
