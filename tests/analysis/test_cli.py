"""`pdm analyze tokens` end to end: two worker processes, real sqlite MLflow, cache and resume."""

from __future__ import annotations

import csv

import pytest

from pdmask.cli import main
from tests.analysis.conftest import SMALL

pytestmark = [pytest.mark.slow, pytest.mark.processes]

FLAGS = [
    f"--{key.replace('_', '-')}={value}" for key, value in SMALL.items() if key != "isolated_tokens"
] + ["--isolated-tokens=2", "--jobs=2"]


def _run(args, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "tokens", *args])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out + captured.err


@pytest.fixture
def tracking(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _runs(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("token-analysis")
    return client, client.search_runs([experiment.experiment_id])


def test_analysis_writes_tables_plot_and_mlflow_run_then_resumes(pdm_home, tracking, capsys):
    code, out = _run([*FLAGS, "--seeds=2", f"--tracking-uri={tracking}"], capsys)
    assert code == 0, out
    assert "2 seeds, 0 cached, 2 to run on 2 process(es)" in out
    assert "[2/2] seed" in out
    folders = list((pdm_home / "analysis" / "tokens").iterdir())
    assert len(folders) == 1
    folder = folders[0]
    for name in ("report.md", "table.csv", "per_seed.csv", "tokens.csv", "summary.json"):
        assert (folder / name).stat().st_size > 0, name
    assert (folder / "paired.png").read_bytes()[:4] == b"\x89PNG"
    report = (folder / "report.md").read_text()
    assert "| out-of-region tokens per seed | 1435 |" in report
    # the console shows the paper-vs-run table as a table and names the report, no raw markdown
    (ratio,) = [line for line in out.splitlines() if "unsafe-keep rate, ratio test" in line]
    assert "36.9" in ratio and "|" not in ratio
    assert "|---" not in out and f"report: {folder / 'report.md'}" in out
    assert "38 of 61" in report
    with open(folder / "per_seed.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 2 * 11  # seeds x optimizers x (keep-all + ten tests)
    assert {r["seed"] for r in rows} == {"0", "1"}
    with open(folder / "table.csv") as handle:
        table = list(csv.DictReader(handle))
    paper_rows = [r for r in table if r["paper"]]
    assert any(
        r["quantity"].startswith("unsafe-keep") and r["paper"] == "0.369" for r in paper_rows
    )

    client, runs = _runs(tracking)
    assert len(runs) == 1
    run = runs[0]
    tags = run.data.tags
    assert tags["pdm.sweep"] == "token-analysis"
    assert tags["pdm.backend"] == "sim"
    assert tags["pdm.kind"] == "token-analysis"
    assert tags["pdm.analysis_hash"] == folder.name
    assert tags["pdm.train_method"] == "dppo-topk-kl"
    assert tags["pdm.git_sha"]
    assert "pdm.trial_hash" not in tags  # never mistaken for a trial by the sweep runner
    assert run.data.metrics["analysis/seeds"] == 2
    assert run.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.md", "table.csv", "paired.png", "per_seed.csv", "tokens.csv"} <= artifacts

    # One more seed: the first two come from the cache; a separate run for the new seed range.
    code, out = _run([*FLAGS, "--seeds=3", f"--tracking-uri={tracking}"], capsys)
    assert code == 0, out
    assert "3 seeds, 2 cached, 1 to run" in out
    with open(folder / "per_seed.csv") as handle:
        assert {r["seed"] for r in csv.DictReader(handle)} == {"0", "1", "2"}
    assert len(_runs(tracking)[1]) == 2

    # Everything cached: nothing recomputed, the finished run is updated rather than duplicated.
    (folder / "seeds" / "seed-0001.json").write_text("{truncated")  # a corrupt file is redone
    code, out = _run([*FLAGS, "--seeds=3", f"--tracking-uri={tracking}"], capsys)
    assert code == 0, out
    assert "3 seeds, 2 cached, 1 to run" in out
    assert len(_runs(tracking)[1]) == 2


def test_bad_flags_are_reported_together_and_launch_nothing(pdm_home, capsys):
    code, out = _run(["--seeds=0", "--delta=-1", "--no-mlflow"], capsys)
    assert code == 2
    assert "--seeds" in out and "--delta" in out
    code, out = _run(["--optimizer=adam", "--no-mlflow"], capsys)
    assert code == 2
    assert "--optimizer" in out


def test_a_sweep_with_several_settings_is_refused(pdm_home, capsys):
    code, out = _run(["--sweep=main-figure", "--no-mlflow"], capsys)
    assert code == 2
    assert "exactly one" in out
