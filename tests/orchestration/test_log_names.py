"""Two trials of one run name never share a log file: the file name carries the trial hash, so
`pdm logs <hash>` prints that trial's log alone and `pdm logs <run name>` asks which one."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdmask.cli import app
from pdmask.orchestration import trial_logs
from pdmask.registry import load_registry


def two_trials_of_one_name():
    """Two real trials whose run names agree (they differ in mu_source, which no name shows)."""
    trial = load_registry().expand("smoke")[0]
    other = trial.model_copy(update={"mu_source": "recompute"})
    assert trial.run_name() == other.run_name() and trial.trial_hash != other.trial_hash
    return trial, other


def write_log(trial, text: str) -> Path:
    path = trial_logs.log_path(trial.sweep, trial.run_name(), trial.trial_hash)
    first = trial_logs.header(trial.run_name(), trial.trial_hash, f"run{trial.trial_hash}", 1)
    return trial_logs.append(path, first, text)


def pdm_logs(home: Path, *args: str):
    return CliRunner().invoke(app, ["logs", *args], env={"PDM_HOME": str(home)})


def test_two_trials_of_one_run_name_log_to_two_files(tmp_path, monkeypatch):
    monkeypatch.setenv("PDM_HOME", str(tmp_path))
    trial, other = two_trials_of_one_name()
    first, second = write_log(trial, "from the first\n"), write_log(other, "from the second\n")
    assert first != second and first.parent == second.parent
    assert first.name == f"{trial.run_name()}.{trial.trial_hash[:8]}.log"
    assert trial_logs.run_name_of(first) == trial.run_name() == trial_logs.run_name_of(second)
    assert "from the second" not in first.read_text()

    # By trial-hash prefix: that trial's log alone.
    shown = pdm_logs(tmp_path, trial.trial_hash[:8])
    assert shown.exit_code == 0, shown.output
    assert "from the first" in shown.stdout and "from the second" not in shown.stdout
    # By its file's stem: the same.
    assert pdm_logs(tmp_path, first.stem).stdout == shown.stdout
    # By the run name both share: refused, naming both files (exit 2, nothing printed of either).
    both = pdm_logs(tmp_path, trial.run_name())
    assert both.exit_code == 2
    assert first.name in both.stderr and second.name in both.stderr
    assert "from the" not in both.stdout


def test_a_run_name_of_one_trial_still_finds_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("PDM_HOME", str(tmp_path))
    trial, _ = two_trials_of_one_name()
    write_log(trial, "alone\n")
    shown = pdm_logs(tmp_path, trial.run_name())
    assert shown.exit_code == 0 and "alone" in shown.stdout
    typo = pdm_logs(tmp_path, trial.run_name().replace("dppo", "dpo"))
    assert typo.exit_code == 2 and f"did you mean {trial.run_name()!r}" in typo.stderr
