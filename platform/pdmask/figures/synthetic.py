"""Synthetic sweep runs in an MLflow store: for tests, the benchmark, and trying a figure spec.

Runs are written through the ordinary MLflow client with the tags and metric names a real sweep
uses, so the figure code cannot tell them apart from trained runs. ``paper_like_runs`` draws
plausible curves for a story the caller tells per method (``MethodStory``: how far it climbs,
whether it collapses at 30B FP8, whether it masks fewer tokens); tests build their own runs with
exactly known values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from pdmask.registry.backends import SIM
from pdmask.tracking.metric_names import HEADLINE_PATTERN

EVAL = HEADLINE_PATTERN.replace("*", "{}")
SETTINGS = {  # panel key -> (model tag, precision tag)
    "4b-bf16": ("qwen3-4b-base", "bf16"),
    "8b-bf16": ("qwen3-8b-base", "bf16"),
    "30b-fp8-e2e": ("qwen3-30b-a3b-base", "fp8-e2e"),
    "30b-fp8-rollout": ("qwen3-30b-a3b-base", "fp8-rollout"),
}


@dataclass(frozen=True)
class MethodStory:
    """How one method's synthetic curves behave."""

    lift: float  # final accuracy above the setting's base level
    collapses_at_30b: bool = False  # its 30B runs collapse and end FAILED
    masks_less: bool = False  # its masked fraction is 0.6x the others'


@dataclass
class SyntheticRun:
    """One run: its tags, final status and metric points (name -> [(step, value, timestamp)])."""

    tags: dict[str, str]
    status: str = "FINISHED"
    metrics: dict[str, list[tuple[int, float, int]]] = field(default_factory=dict)


def trial_tags(
    method: str,
    setting: str,
    seed: int,
    *,
    sweep: str,
    delta: float | None,
    backend: str = SIM.name,
) -> dict[str, str]:
    """The tags the sweep runner puts on a trial's run (design contract)."""
    model, precision = SETTINGS[setting]
    return {
        "pdm.sweep": sweep,
        "pdm.trial_hash": hashlib.sha256(
            repr((method, setting, seed, sweep, delta)).encode()
        ).hexdigest()[:16],
        "pdm.method": method,
        "pdm.model": model,
        "pdm.precision": precision,
        "pdm.delta": "" if delta is None else f"{delta:g}",
        "pdm.seed": str(seed),
        "pdm.backend": backend,
        "pdm.git_sha": "0123456789abcdef0123456789abcdef01234567",
        "pdm.setting": setting,
    }


def write_runs(client, experiment: str, runs: Iterable[SyntheticRun], artifact_dir: str) -> list:
    """Create the experiment if needed and log every run; returns the run ids in order."""
    from mlflow.entities import Metric

    found = client.get_experiment_by_name(experiment)
    exp_id = (
        found.experiment_id
        if found
        else client.create_experiment(experiment, artifact_location=artifact_dir)
    )
    ids = []
    for run in runs:
        created = client.create_run(exp_id, tags=run.tags)
        rid = created.info.run_id
        points = [
            Metric(k, float(v), int(t), int(s)) for k, pts in run.metrics.items() for s, v, t in pts
        ]
        for start in range(0, len(points), 1000):  # MLflow's log_batch limit
            client.log_batch(rid, metrics=points[start : start + 1000])
        if run.status != "RUNNING":
            client.set_terminated(rid, status=run.status)
        ids.append(rid)
    return ids


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def paper_like_runs(
    methods: Mapping[str, MethodStory],
    *,
    seeds: int = 3,
    points: int = 60,
    eval_every: int = 5,
    sweep: str = "main-figure",
    delta: float = 0.15,
    datasets: Iterable[str] = ("aime24", "aime25"),
    settings: Mapping[str, tuple[str, str]] = SETTINGS,
    diagnostics: bool = True,
    rng_seed: int = 0,
) -> list[SyntheticRun]:
    """Plausible Figure-1-like runs of ``methods``, each following its story."""
    rng = np.random.default_rng(rng_seed)
    base = {"4b-bf16": 0.18, "8b-bf16": 0.25, "30b-fp8-e2e": 0.30, "30b-fp8-rollout": 0.32}
    runs = []
    steps = np.arange(1, points + 1) * eval_every
    for setting in settings:
        for method, story in methods.items():
            for seed in range(seeds):
                collapse = story.collapses_at_30b and setting.startswith("30b")
                stop = int(points * rng.uniform(0.45, 0.7)) if collapse else points
                x = np.linspace(-2.5, 2.5, points)
                level = base.get(setting, 0.2) + story.lift
                mean = 0.05 + level * _sigmoid(x)
                if collapse:
                    mean = mean * np.clip(
                        1.0 - np.maximum(0, np.arange(points) - stop + 12) / 12, 0.05, 1
                    )
                run = SyntheticRun(
                    trial_tags(method, setting, seed, sweep=sweep, delta=delta),
                    status="FAILED" if collapse else "FINISHED",
                )
                for i, ds in enumerate(datasets):
                    noise = rng.normal(0, 0.02, points) + 0.01 * (i - 0.5) + rng.normal(0, 0.01)
                    vals = np.clip(mean + noise, 0, 1)
                    run.metrics[EVAL.format(ds)] = [
                        (int(s), float(v), 1_700_000_000_000 + int(s))
                        for s, v in zip(steps[:stop], vals[:stop], strict=True)
                    ]
                if diagnostics:
                    train_steps = np.arange(1, stop * eval_every + 1)
                    t = train_steps / train_steps.max()
                    grow = 3.0 if collapse else 1.0
                    diag = {
                        "actor/pdm/masked_frac": 2e-3
                        * (1 + grow * t)
                        * (0.6 if story.masks_less else 1.0),
                        "actor/pdm/kl_topk_mean": 5e-3 * (1 + grow * 2 * t),
                        "actor/pdm/disagree_agg": 0.05 + 0.01 * t,
                        "actor/pdm/disagree_uni": 0.049 + 0.01 * t,
                    }
                    for name, curve in diag.items():
                        noisy = curve * np.exp(rng.normal(0, 0.15, train_steps.size))
                        run.metrics[name] = [
                            (int(s), float(v), 1_700_000_000_000 + int(s))
                            for s, v in zip(train_steps, noisy, strict=True)
                        ]
                runs.append(run)
    return runs
