"""The analysis's MLflow run, in the experiment of the sweep it analyses.

Tags follow the run contract where it applies (``pdm.sweep``, ``pdm.backend``, model, precision,
delta, git SHA and dirty flag, package versions) plus ``pdm.kind = token-analysis`` and the config
hash. It carries no ``pdm.trial_hash``, so the sweep runner never mistakes it for a trial. One run
per analysis (config hash and seed range): rerunning a finished analysis updates its artifacts
instead of adding a run.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from pdmask.analysis.summary import STEP_TESTS
from pdmask.paths import project_root

KIND = "token-analysis"


def pooled_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The pooled figures as flat MLflow metric names."""
    out = {
        "analysis/seeds": summary["seeds"],
        "analysis/out_of_region_per_seed": summary["out_of_region_per_seed"],
        "analysis/tokens_per_seed": summary["tokens_per_seed"],
        "analysis/wall_s_per_seed": summary["wall_s_per_seed"],
    }
    for test, value in summary["disagree_per_seed"].items():
        out[f"analysis/disagree_per_seed/{test}"] = value
    for opt, data in summary["optimizers"].items():
        out[f"analysis/{opt}/lr_mean"] = data["lr_mean"]
        for test, t in data["tests"].items():
            out[f"analysis/{opt}/unsafe_keep/{test}"] = t["unsafe_keep"]
            out[f"analysis/{opt}/unsafe_keep_seed_mean/{test}"] = t["unsafe_keep_seed_mean"]
            out[f"analysis/{opt}/shrink_share/{test}"] = t["shrink_share"]
            if "vs_ratio" in t:
                out[f"analysis/{opt}/seeds_favouring/{test}"] = t["vs_ratio"]["seeds_favouring"]
                out[f"analysis/{opt}/sign_test_p/{test}"] = t["vs_ratio"]["sign_test_p"]
    for layers, variant in summary["isolated"].items():
        for test, acc in variant["accuracy"].items():
            out[f"analysis/isolated/{layers}/sign_accuracy/{test}"] = acc
    return {k: float(v) for k, v in out.items() if not math.isnan(float(v))}


def per_seed_metrics(records: list[dict], summary: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(name, value, step = seed) histories of the per-seed unsafe-keep rates and counts."""
    out = []
    for record in records:
        seed = record["seed"]
        out.append(("analysis/seed/out_of_region", float(record["out_of_region"]), seed))
        out.append(("analysis/seed/disagree/agg", float(record["disagree"]["agg"]), seed))
        for opt, per_test in record["outcomes"].items():
            for test in STEP_TESTS:
                c = per_test[test]
                if c["kept"]:
                    out.append(
                        (f"analysis/seed/{opt}/unsafe_keep/{test}", c["grew"] / c["kept"], seed)
                    )
    return out


def log_analysis_run(
    *,
    tracking_uri: str | None,
    experiment: str,
    run_key: str,
    run_name: str,
    tags: dict[str, str],
    params: dict[str, Any],
    summary: dict[str, Any],
    records: list[dict],
    artifacts: list[Path],
) -> str:
    """Create or update the analysis run; returns its run id."""
    from mlflow.entities import Metric, Param, RunTag

    from pdmask.tracking import ensure_experiment, open_client, provenance_tags
    from pdmask.tracking.runs import with_retry

    client = open_client(tracking_uri)
    experiment_id = ensure_experiment(client, experiment)
    found = with_retry(
        lambda: client.search_runs(
            [experiment_id], filter_string=f"tags.`pdm.analysis_run` = '{run_key}'", max_results=1
        )
    )
    all_tags = {**tags, **provenance_tags(project_root()), "pdm.kind": KIND}
    all_tags["pdm.analysis_run"] = run_key
    if found:
        run_id = found[0].info.run_id
        fresh = found[0].info.status != "FINISHED"
        with_retry(lambda: client.update_run(run_id, status="RUNNING"))
    else:
        run = with_retry(
            lambda: client.create_run(
                experiment_id, run_name=run_name, tags={**all_tags, "mlflow.runName": run_name}
            )
        )
        run_id, fresh = run.info.run_id, True
    now = int(time.time() * 1000)
    batch_tags = [RunTag(k, str(v)) for k, v in all_tags.items()]
    batch_params = [Param(k, str(v)) for k, v in params.items()] if not found else []
    with_retry(lambda: client.log_batch(run_id, params=batch_params, tags=batch_tags))
    if fresh:
        metrics = [Metric(k, v, now, 0) for k, v in pooled_metrics(summary).items()]
        metrics += [Metric(k, v, now, s) for k, v, s in per_seed_metrics(records, summary)]
        for start in range(0, len(metrics), 900):  # MLflow caps a batch at 1000 entries
            chunk = metrics[start : start + 900]
            with_retry(lambda c=chunk: client.log_batch(run_id, metrics=c))
    for path in artifacts:
        with_retry(lambda p=path: client.log_artifact(run_id, str(p)))
    with_retry(lambda: client.set_terminated(run_id, status="FINISHED"))
    return run_id
