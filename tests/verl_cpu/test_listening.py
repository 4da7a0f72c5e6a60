"""The process watch the real-VeRL tests count ranks and workers with (``listening.py``)."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.verl_cpu.listening import ListenWatch

# A process titled like a Ray actor (``exec -a`` sets the first word of its command line, where
# such titles live) that forks a child; the child keeps the title, as a fork does until it runs
# a program of its own.
_FORKING_ACTOR = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    time.sleep(3); os._exit(0)\n"
    "time.sleep(3); os.wait()\n"
)


def test_a_fork_is_counted_with_its_parent_not_as_a_process_of_its_kind():
    proc = subprocess.Popen(
        ["bash", "-c", 'exec -a "ray::WorkerDict" "$0" -c "$1"', sys.executable, _FORKING_ACTOR],
        start_new_session=True,
    )
    with ListenWatch(proc.pid, period=0.2) as watch:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline and len(watch.titles) < 2:
            time.sleep(0.1)
    assert proc.wait(timeout=10) == 0
    titled = {p for p, titles in watch.titles.items() if "ray::WorkerDict" in titles}
    assert len(titled) == 2, watch.titles  # the parent and its fork, both seen with the title
    assert watch.pids_titled("ray::WorkerDict") == {proc.pid}
