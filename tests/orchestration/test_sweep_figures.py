"""A sweep's dashboards: checked before anything launches, drawn from the sweep's own trials
(never another profile's runs of the same experiment), and a figure that fails fails the sweep."""

from __future__ import annotations

import json

import pytest

from pdmask.registry import load_registry

from .conftest import pdm, store_client, sweep_runs, write_sweep

pytestmark = [pytest.mark.slow, pytest.mark.processes]

FIGURE = """name: {name}
sweep: fig
delta: 0.15
methods: [dppo-topk-kl, pdm-agg]
panels:
  - {{key: 4b-fp8-rollout, title: 4B FP8 rollout, model: qwen3-4b-base, precision: fp8-rollout}}
metric:
  pattern: "{pattern}"
"""

SWEEP = """backend: sim
profile: smoke
seeds: 1
figures: [{figures}]
grid:
  method: [dppo-topk-kl, pdm-agg]
  model: [qwen3-4b-base]
  precision: [fp8-rollout]
  delta: [0.15]
"""


def _dashboard(project, name: str, body: str) -> None:
    (project / "dashboards" / f"{name}.yaml").write_text(body)


def test_every_dashboard_of_a_sweep_is_checked_before_launch(project):
    _dashboard(
        project, "malformed", FIGURE.format(name="malformed", pattern="x/*/y") + "colour: red\n"
    )
    # written the old way: avg@32 is logged by neither backend
    _dashboard(
        project, "no-metric", FIGURE.format(name="no-metric", pattern="val-core/*/acc/mean@32")
    )
    _dashboard(
        project,
        "no-trials",
        FIGURE.format(name="no-trials", pattern="val-core/*/acc/mean@16").replace("0.15", "0.05"),
    )
    write_sweep(project, "fig", SWEEP.format(figures="malformed, no-metric, no-trials"))
    for args in (("validate", "fig"), ("sweep", "fig")):
        out = pdm(project, *args)
        assert out.returncode == 2, out.stdout + out.stderr
        err = out.stderr
        assert "malformed.yaml:9: colour:" in err, err
        assert "no-metric.yaml:8: metric.pattern:" in err and "matches none" in err, err
        assert "no-trials.yaml:5: panels: selects none of the sweep's 2 trials" in err, err
    assert not (project / ".pdm" / "ray_results").exists()
    assert not (project / ".pdm" / "trials").exists()


def test_figures_draw_the_sweeps_own_trials_and_a_failed_figure_fails_the_sweep(project):
    _dashboard(
        project, "fig-eval", FIGURE.format(name="fig-eval", pattern="val-core/*/acc/mean@16")
    )
    write_sweep(project, "fig", SWEEP.format(figures="fig-eval"))
    out = pdm(project, "sweep", "fig", "--no-figures")
    assert out.returncode == 0, out.stdout + out.stderr
    ours = {t.trial_hash for t in load_registry(project).expand("fig")}
    # Runs of the same experiment under another profile (as `--profile default` would leave),
    # started later, so a figure that picked by cell and seed would take them instead.
    client = store_client(project)
    for run in sweep_runs(project, "fig"):
        other_hash = run.data.tags["pdm.method"][:4].ljust(16, "0")  # not one of ours
        tags = {**run.data.tags, "pdm.profile": "default", "pdm.trial_hash": other_hash}
        other = client.create_run(run.info.experiment_id, tags=tags)
        for step in range(0, 9, 2):
            client.log_metric(other.info.run_id, "val-core/synth/acc/mean_at_16", 0.9, step=step)
        client.set_terminated(other.info.run_id, "FINISHED")

    out = pdm(project, "sweep", "fig")
    assert out.returncode == 0, out.stdout + out.stderr
    folder = project / ".pdm" / "figures" / "fig" / "fig-eval"
    manifest = json.loads((folder / "fig-eval.manifest.json").read_text())
    assert {r["trial_hash"] for r in manifest["runs"]} == ours
    assert manifest["ignored_runs"] == {"other trial config (profile, steps, ...)": 2}

    # Without the sweep's trials to go by, runs of two trials on one line and seed are an error,
    # never one silently replacing the other.
    out = pdm(project, "figure", "fig-eval", "--sweep", "fig")
    assert out.returncode == 2 and "runs of different trials" in out.stderr, out.stderr

    # A figure that cannot be written fails the sweep (it used to exit 0).
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    folder.write_text("in the way")
    out = pdm(project, "sweep", "fig")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "figure fig-eval failed" in out.stdout
