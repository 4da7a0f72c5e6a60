"""`pdm ui`: listens on loopback only, links each sweep's runs table (checked in a real headless
Chromium), and leaves no process behind whether it is stopped by SIGINT, SIGTERM or SIGKILL.

Without chromium the browser test is skipped; CI installs it (Debian's `chromium` package)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

import psutil
import pytest

from pdmask.registry import load_registry
from pdmask.tracking.store import DESCRIPTION_TAG, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND
from pdmask.tracking.ui import runs_table_url

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
DOM_READS = 3


@pytest.fixture
def store(project):
    """The project's sqlite store with the smoke sweep's experiment and one finished run per trial."""
    from pdmask.tracking import ensure_experiment, open_client

    client = open_client()
    experiment_id = ensure_experiment(client, "smoke", DESCRIPTION)
    names = []
    for step, trial in enumerate(load_registry(project).expand("smoke")):
        run = client.create_run(experiment_id, run_name=trial.run_name(), tags=trial.tags())
        client.log_metric(run.info.run_id, "val-core/synth/acc/mean_at_16", 0.25, step=step)
        client.set_terminated(run.info.run_id)
        names.append(trial.run_name())
    return client, experiment_id, names


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
            links = [proc.stdout.readline().strip() for _ in range(_experiments(project))]
            return proc, line.split()[2], links
    proc.kill()
    raise AssertionError(f"pdm ui did not start:\n{''.join(seen)[-3000:]}")


def _experiments(project) -> int:
    from pdmask.tracking import open_client

    return sum(e.name != "Default" for e in open_client().search_experiments())


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


def _dom(url: str) -> str:
    """The page as Chromium renders it once the UI's scripts have run (a fresh profile)."""
    with tempfile.TemporaryDirectory(prefix="pdm-chromium-") as profile:
        browser = subprocess.Popen(
            [
                CHROMIUM,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--virtual-time-budget=30000",
                "--dump-dom",
                url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            return browser.communicate(timeout=240)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(browser.pid, signal.SIGKILL)
            browser.wait()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `apt-get install chromium`")
def test_ui_links_the_sweeps_runs_table(project, store):
    client, experiment_id, run_names = store
    experiment = client.get_experiment(experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    assert experiment.tags[DESCRIPTION_TAG] == DESCRIPTION
    proc, url, links = _start(project, "smoke")
    procs = _tree(proc.pid)
    try:
        _check_loopback_only(procs, url)
        link = runs_table_url(url, experiment_id)
        assert links == [f"smoke: {link}"]
        # The runs table of the experiment, not the GenAI overview or traces page it would open.
        # A dump can come before the table's rows render (the runs search answers last): the
        # page is read again, a few times, before the test says it is not there.
        wanted = [f"<title>Runs - Experiment {experiment_id} - MLflow</title>", *run_names]
        wanted.append(DESCRIPTION)
        for _ in range(DOM_READS):
            page = _dom(link)
            missing = [w for w in wanted if w not in page]
            if not missing:
                break
        assert not missing, (missing, page[-3000:])
    finally:
        _stop_and_check_nothing_left(proc, procs, signal.SIGINT)


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
