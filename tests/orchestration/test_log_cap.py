"""A trial log keeps at most ``PDM_TRIAL_LOG_MAX_BYTES`` of each attempt: its head and its tail,
with a line saying what was cut between them; a killed attempt's part is cut by the next one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pdmask.orchestration import trial_logs

pytestmark = pytest.mark.processes

CAP = 256 * 1024
ATTEMPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from pdmask.orchestration.trial_logs import captured, header

    path, attempt, megabytes, end = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with captured(path, header("run-a", "abcd1234", "f" * 32, attempt)):
        os.write(1, f"FIRST LINE OF ATTEMPT {attempt}\\n".encode())
        line = b"x" * 1023 + b"\\n"
        for _ in range(megabytes * 1024):
            os.write(1, line)
        os.write(2, f"LAST LINE OF ATTEMPT {attempt}\\n".encode())
        if end == "killed":
            os._exit(1)  # as the watchdog or the OOM killer ends a process: no end line
    """
)
CUT = re.compile(r"=== pdm: ([\d,]+) bytes of this attempt's output cut here")


def _attempt(path: Path, attempt: int, megabytes: int, end: str = "finished") -> int:
    env = {**os.environ, trial_logs.MAX_BYTES_ENV: str(CAP)}
    args = [sys.executable, "-c", ATTEMPT, str(path), str(attempt), str(megabytes), end]
    return subprocess.run(args, env=env, timeout=120).returncode


def _parts(path: Path) -> list[bytes]:
    """The file split at each attempt's header line."""
    data = path.read_bytes()
    return [b"=== pdm trial log" + p for p in data.split(b"=== pdm trial log")[1:]]


def test_an_attempt_that_prints_megabytes_keeps_its_head_and_tail(tmp_path):
    log = tmp_path / "run-a.log"
    assert _attempt(log, 1, megabytes=3) == 0
    (part,) = _parts(log)
    assert len(part) < CAP + 1024  # the cap, plus the header, the cut line and the end line
    text = part.decode()
    assert "FIRST LINE OF ATTEMPT 1" in text and "LAST LINE OF ATTEMPT 1" in text
    assert text.endswith("=== attempt ended: finished ===\n")
    (cut,) = CUT.findall(text)
    kept = text.count("x" * 1023)
    assert int(cut.replace(",", "")) + kept * 1024 == pytest.approx(3 * 2**20, abs=2 * 1024)


def test_a_killed_attempt_is_cut_when_the_next_starts_and_earlier_parts_stay(tmp_path):
    log = tmp_path / "run-a.log"
    assert _attempt(log, 1, megabytes=2) == 0
    first = _parts(log)[0]
    assert _attempt(log, 2, megabytes=2, end="killed") == 1
    assert len(log.read_bytes()) > 2 * 2**20  # nobody cut the killed attempt's part yet
    assert _attempt(log, 3, megabytes=0) == 0
    parts = _parts(log)
    assert len(parts) == 3 and parts[0] == first
    killed = parts[1].decode()
    assert len(parts[1]) < CAP + 1024 and "attempt ended" not in killed
    assert "FIRST LINE OF ATTEMPT 2" in killed and killed.endswith("LAST LINE OF ATTEMPT 2\n")
    assert len(CUT.findall(killed)) == 1
    assert CUT.findall(parts[2].decode()) == [] and "LAST LINE OF ATTEMPT 3" in parts[2].decode()


def test_a_job_driver_log_appended_whole_is_cut_too(tmp_path, monkeypatch):
    monkeypatch.setenv(trial_logs.MAX_BYTES_ENV, str(CAP))
    log = tmp_path / "run-a.log"
    small = trial_logs.append(log, "=== pdm trial log: run-a attempt 1 ===\n", "short\n")
    before = small.read_bytes()
    text = "driver starts\n" + "y" * 999 + "\n" + ("z" * 99 + "\n") * 20000 + "driver ends\n"
    trial_logs.append(log, "=== pdm trial log: run-a attempt 2 ===\n", text)
    data = log.read_bytes()
    assert data.startswith(before) and len(data) < len(before) + CAP + 1024
    assert b"driver starts" in data and data.endswith(b"driver ends\n")
    assert len(CUT.findall(data.decode())) == 1


def test_an_attempt_uploaded_before_it_ends_goes_up_cut(tmp_path, monkeypatch):
    """The watchdog uploads a stalled attempt's log before the process ends: cut all the same."""
    from mlflow import MlflowClient

    monkeypatch.setenv(trial_logs.MAX_BYTES_ENV, str(CAP))
    log = tmp_path / "run-a.log"
    first = trial_logs.header("run-a", "abcd1234", "f" * 32, 1)
    log.write_text(first + "start\n" + ("w" * 511 + "\n") * 4096 + "stalled here\n")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("s", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(experiment).info.run_id
    assert trial_logs.upload(client, run_id, log)
    copy = Path(client.download_artifacts(run_id, "logs/run-a.log", str(tmp_path / "down")))
    data = copy.read_bytes()
    assert data == log.read_bytes() and len(data) < CAP + 1024
    assert data.startswith(first.encode() + b"start") and data.endswith(b"stalled here\n")


def test_the_cap_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(trial_logs.MAX_BYTES_ENV, raising=False)
    assert trial_logs.max_attempt_bytes() == trial_logs.DEFAULT_MAX_BYTES
    monkeypatch.setenv(trial_logs.MAX_BYTES_ENV, "5000")
    assert trial_logs.max_attempt_bytes() == 5000
    monkeypatch.setenv(trial_logs.MAX_BYTES_ENV, "lots")
    assert trial_logs.max_attempt_bytes() == trial_logs.DEFAULT_MAX_BYTES


@pytest.mark.parametrize("read", ["in the head", "in the part cut", "in the tail"])
def test_a_follower_goes_on_from_the_same_byte_after_the_cut(tmp_path, monkeypatch, read):
    """`pdm logs -f` had read part of an attempt when its end cut the log: it goes on from the
    byte it had reached (or from the cut line, when that byte was cut out)."""
    monkeypatch.setenv(trial_logs.MAX_BYTES_ENV, str(CAP))
    log = tmp_path / "run-a.log"
    lines = [f"line {i:06d} ".encode() + b"v" * 100 + b"\n" for i in range(8000)]
    trial_logs.append(log, "=== pdm trial log: run-a attempt 1 ===\n", "short\n")
    before = log.read_bytes()
    log.write_bytes(before + b"=== pdm trial log: run-a attempt 2 ===\n" + b"".join(lines))
    old = log.read_bytes()
    offset = {"in the head": len(before) + 1000, "in the part cut": len(old) // 2}.get(
        read, len(old) - 5000
    )
    trial_logs._cap(log, len(before))
    new = log.read_bytes()
    assert len(new) < offset or read == "in the head"
    resumed = trial_logs.offset_after_cut(log, offset)
    if read == "in the head":  # what it read stays where it was; the cut line comes later
        assert resumed == offset and new[:offset] == old[:offset]
    elif read == "in the part cut":
        assert CUT.match(new[resumed:].decode()[1:]) and new.endswith(old[-5000:])
    else:
        assert new[resumed:] == old[offset:]
