"""Names are names, not paths: a sweep, run or figure given as `..`, a glob or an absolute path
exits 2 with a problem naming the argument and the known names, before any file is read."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from pdmask.orchestration.trial_logs import HASH_CHARS, header

from .conftest import pdm

pytestmark = pytest.mark.processes

HOSTILE = ("../..", "../../**", "*", "smoke/..", "..")


_watch: list[tuple[str, str]] | None = None  # (event, path) while a block below watches


def _audit(event: str, args: tuple) -> None:
    watched = _watch is not None and event in ("open", "os.scandir", "os.listdir")
    if watched and args and isinstance(args[0], str | bytes | Path):
        _watch.append((event, str(Path(os.fsdecode(args[0])).resolve())))


sys.addaudithook(_audit)  # cannot be removed: it records only inside `touched`


@contextmanager
def touched():
    """Every file opened and folder listed inside the block (CPython's audit events)."""
    global _watch
    _watch = []
    try:
        yield _watch
    finally:
        _watch = None


@pytest.fixture
def logs(project: Path) -> Path:
    """One trial log of sweep smoke, and a log outside the logs folder that `..` would reach."""
    folder = project / ".pdm" / "logs" / "smoke"
    folder.mkdir(parents=True)
    first = header("pdm-agg-run", "3f2a9c1d" + "0" * 56, "r" * 32, 1)
    (folder / "pdm-agg-run.log").write_text(first + "the run's own line\n")
    (project / "outside.log").write_text("OUTSIDE\n")
    (project / ".pdm" / "stray.log").write_text("STRAY\n")
    return folder


@pytest.mark.parametrize("value", [*HOSTILE, "ABSOLUTE"])
def test_logs_sweep_that_is_a_path_reads_no_file(logs, project, value):
    value = str(project) if value == "ABSOLUTE" else value
    with touched() as seen:
        result = pdm("logs", "pdm-agg-run", "--sweep", value)
    assert result.exit_code == 2, result.output
    assert f"--sweep: {value!r} is a path or a pattern, not a name;" in result.stderr
    assert "known: smoke" in result.stderr
    assert "OUTSIDE" not in result.output and "STRAY" not in result.output
    assert "Traceback" not in result.output
    under_project = [path for _, path in seen if Path(path).is_relative_to(project.resolve())]
    assert not [p for p in under_project if p.endswith(".log")], under_project
    assert set(under_project) <= {str(project.resolve() / ".pdm"), str(logs.parent.resolve())}


@pytest.mark.parametrize("value", ["../../outside", "../stray", "/etc/passwd", "pdm-agg-*"])
def test_logs_run_that_is_a_path_reads_no_file(logs, project, value):
    with touched() as seen:
        result = pdm("logs", value)
    assert result.exit_code == 2, result.output
    assert f"RUN: {value!r} is a path or a pattern, not a name;" in result.stderr
    assert "known: pdm-agg-run" in result.stderr
    assert not [path for _, path in seen if path.endswith(".log")]


def test_logs_by_name_and_hash_prefix_still_print(logs):
    by_name = pdm("logs", "pdm-agg-run", "--sweep", "smoke")
    assert by_name.exit_code == 0 and "the run's own line" in by_name.stdout
    by_hash = pdm("logs", "3f2a9c1d")
    assert by_hash.exit_code == 0 and by_hash.stdout == by_name.stdout
    other = pdm("logs", "pdm-agg-run", "--sweep", "main-figure")
    assert other.exit_code == 2
    assert "'main-figure' names no sweep with logs; known: smoke" in other.stderr
    unknown_hash = pdm("logs", "abcdef12")
    assert unknown_hash.exit_code == 2 and "known: pdm-agg-run" in unknown_hash.stderr


@pytest.mark.parametrize("value", [*HOSTILE, "ABSOLUTE"])
def test_figure_sweep_that_is_a_path_builds_no_folder(project, value):
    value = str(project / "elsewhere") if value == "ABSOLUTE" else value
    result = pdm("figure", "figure-1", "--sweep", value)
    assert result.exit_code == 2, result.output
    assert f"--sweep: {value!r} is a path or a pattern, not a name" in result.stderr
    assert "main-figure" in result.stderr  # the known sweeps
    assert not (project / ".pdm" / "figures").exists()
    assert not (project / "elsewhere").exists() and not (project / "figure-1").exists()


@pytest.mark.parametrize("value", ["../../**", "../dashboards/figure-1", "/etc/passwd"])
def test_figure_name_that_is_a_path_is_refused(project, value):
    result = pdm("figure", value)
    assert result.exit_code == 2, result.output
    assert f"NAME: {value!r} is a path or a pattern, not a name;" in result.stderr
    assert "known: figure-1" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "{}", "--dry-run"],
        ["validate", "{}"],
        ["runs", "{}"],
        ["analyze", "tokens", "--sweep", "{}", "--no-mlflow"],
    ],
)
@pytest.mark.parametrize("value", ["../..", "/etc", "sm*"])
def test_sweep_names_elsewhere_are_matched_against_the_registry(project, argv, value):
    result = pdm(*[value if a == "{}" else a for a in argv])
    assert result.exit_code == 2, result.output
    assert f"sweep {value!r}" in result.stderr and "main-figure" in result.stderr
    assert "Traceback" not in result.output


def test_an_unknown_run_offers_each_run_name_once(logs):
    """A log's file stem (run name and hash) is accepted as a name, but the problem offers the
    run names only: a list of each name twice buries the "did you mean"."""
    trial_hash = "5e7b" + "1" * 60
    stem = f"pdm-gram-run.{trial_hash[:HASH_CHARS]}"
    (logs / f"{stem}.log").write_text(header("pdm-gram-run", trial_hash, "s" * 32, 1) + "line\n")
    assert pdm("logs", stem).exit_code == 0
    result = pdm("logs", "pdm-gram-rn")
    assert result.exit_code == 2
    assert "did you mean 'pdm-gram-run'" in result.stderr
    assert "known: pdm-agg-run, pdm-gram-run\n" in result.stderr
    assert stem not in result.stderr
