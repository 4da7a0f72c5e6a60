"""Run the analysis over seeds on a process pool, cache each seed, and write every output.

Seeds run in ``jobs`` worker processes (spawned, one torch thread each: two workers use a 2-core
machine fully). Each finished seed is written at once to ``<out>/seeds/seed-NNNN.json`` together
with the config hash, so Ctrl-C loses only the seeds in flight and a rerun with the same flags
skips what is cached. When all seeds are in: ``report.md``, ``table.csv``, ``per_seed.csv``,
``tokens.csv``, ``summary.json``, ``paired.png`` and an MLflow run carrying them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdmask.analysis.config import ANALYSIS_VERSION, TokenAnalysisConfig
from pdmask.analysis.setting import TrainingSetting, resolve_setting

Progress = Callable[[str], None]


@dataclass
class AnalysisResult:
    out_dir: Path
    paths: dict[str, Path]
    summary: dict[str, Any]
    records: list[dict]
    run_id: str | None
    wall_s: float


def default_out_dir(config_hash: str) -> Path:
    from pdmask.paths import state_dir

    return state_dir() / "analysis" / "tokens" / config_hash


def _seed_path(folder: Path, seed: int) -> Path:
    return folder / "seeds" / f"seed-{seed:04d}.json"


def _write_json(payload: Any, path: Path) -> None:
    """Atomic: a half-written cache file can never be read back as a finished seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def load_cached(folder: Path, seed: int, config_hash: str) -> dict | None:
    path = _seed_path(folder, seed)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("config_hash") == config_hash else None


def _init_worker(ignore_interrupt: bool = True) -> None:
    """One torch thread, deterministic kernels; Ctrl-C is the parent's to handle (it terminates
    the pool), so a worker does not print a traceback of its own."""
    import signal

    import torch

    if ignore_interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _run_seed(job: tuple[dict, dict, int, str, str]) -> dict:
    """Worker entry point: analyse one seed and cache it before returning."""
    cfg_data, setting_data, seed, config_hash, folder = job
    from pdmask.analysis.seed import analyse_seed

    cfg = TokenAnalysisConfig.model_validate(cfg_data)
    record = analyse_seed(cfg, TrainingSetting(**setting_data), seed)
    record.update(config_hash=config_hash, version=ANALYSIS_VERSION)
    _write_json(record, _seed_path(Path(folder), seed))
    return record


def _describe(record: dict) -> str:
    parts = [
        f"seed {record['seed']}: {record['out_of_region']} out of region, "
        f"{record['disagree']['agg']} disagree (agg)"
    ]
    for opt, per_test in record["outcomes"].items():
        rates = []
        for test in ("ratio", "agg"):
            c = per_test[test]
            rates.append(f"{test} {100 * c['grew'] / c['kept']:.0f}%" if c["kept"] else f"{test} –")
        parts.append(f"{opt} unsafe-keep " + " / ".join(rates))
    return "; ".join(parts) + f" ({record['wall_s']:.0f} s)"


def _analyse_seeds(cfg, setting, todo, config_hash, folder, jobs, progress) -> list[dict]:
    done: list[dict] = []
    jobs_args = [
        (cfg.model_dump(mode="json"), setting.__dict__, s, config_hash, str(folder)) for s in todo
    ]
    started = time.perf_counter()

    def report(record: dict) -> None:
        done.append(record)
        elapsed = time.perf_counter() - started
        eta = elapsed / len(done) * (len(todo) - len(done))
        progress(f"[{len(done)}/{len(todo)}] {_describe(record)}; ETA {eta / 60:.1f} min")

    if jobs <= 1:
        import torch

        threads = torch.get_num_threads()
        deterministic = torch.are_deterministic_algorithms_enabled()
        try:
            _init_worker(ignore_interrupt=False)
            for job in jobs_args:
                report(_run_seed(job))
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)
        return done
    context = multiprocessing.get_context("spawn")
    with context.Pool(jobs, initializer=_init_worker) as pool:
        for record in pool.imap_unordered(_run_seed, jobs_args):
            report(record)
    return done


def _prepare_base_model(setting: TrainingSetting, progress: Progress) -> dict[str, Any]:
    """Build the stand-in's base model once, before the workers start (they would queue on it).

    Opening the seed-0 trial state builds it exactly as the trainer does (cached, locked).
    """
    from pdmask.backends.sim.backend import sim_config
    from pdmask.backends.sim.trainer import TrialState

    sim_cfg = sim_config(setting.trial(0))
    progress(f"base model of {sim_cfg.stand_in} (built once, then cached)")
    TrialState(sim_cfg)
    return {"stand_in": sim_cfg.stand_in, "budget": sim_cfg.resolved(), "task": sim_cfg.task}


def run_token_analysis(
    cfg: TokenAnalysisConfig,
    *,
    out: Path | None = None,
    tracking_uri: str | None = None,
    jobs: int = 2,
    track: bool = True,
    progress: Progress = print,
) -> AnalysisResult:
    """Analyse every seed (resuming from the cache), then write the outputs and the MLflow run.

    Raises:
        ConfigError: the sweep is not one training setting, or its method has no delta and
            none is given; ``ValidationFailed`` for a sweep that does not expand.
        TrackingError: the tracking store cannot be opened (``track``).
    """
    started = time.perf_counter()
    setting = resolve_setting(cfg)
    config_hash = cfg.config_hash(setting.identity())
    folder = Path(out) if out is not None else default_out_dir(config_hash)
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(
        {"config": cfg.model_dump(mode="json"), "setting": setting.__dict__, "hash": config_hash},
        folder / "config.json",
    )
    cached = {s: load_cached(folder, s, config_hash) for s in cfg.seed_list}
    records = [r for r in cached.values() if r is not None]
    todo = [s for s, r in cached.items() if r is None]
    progress(
        f"token analysis {config_hash}: {len(cfg.seed_list)} seeds, {len(records)} cached, "
        f"{len(todo)} to run on {jobs} process(es); output {folder}"
    )
    base = _prepare_base_model(setting, progress)
    if todo:
        try:
            records += _analyse_seeds(cfg, setting, todo, config_hash, folder, jobs, progress)
        except KeyboardInterrupt:
            done = sum(load_cached(folder, s, config_hash) is not None for s in cfg.seed_list)
            progress(f"interrupted: {done} of {len(cfg.seed_list)} seeds cached; rerun to resume")
            raise
    from pdmask.analysis.outputs import write_outputs

    meta = {
        **{k: v for k, v in setting.template.items() if k in ("model", "precision")},
        "train_method": setting.template["method"],
        "stand_in": base["stand_in"],
        "delta": setting.delta,
        "train_steps": cfg.train_steps,
        "prompts": cfg.prompts or base["budget"].prompts_per_step,
        "minibatches": cfg.minibatches or base["budget"].minibatches,
        "analysed_minibatches": cfg.analysed_minibatches,
        "split": cfg.split,
        "task": base["task"],
        "profile": setting.template["profile"],
        "tie_tol": cfg.tie_tol,
        "config_hash": config_hash,
    }
    summary, paths = write_outputs(records, meta, folder)
    run_id = None
    if track:
        from pdmask.analysis.tracking import log_analysis_run

        first, last = cfg.seed_list[0], cfg.seed_list[-1]
        run_id = log_analysis_run(
            tracking_uri=tracking_uri,
            experiment=cfg.sweep,
            run_key=f"{config_hash}-{first}-{last}",
            run_name=f"token-analysis-{config_hash}-s{first}-{last}",
            tags={**setting.tags(), "pdm.sweep": cfg.sweep, "pdm.analysis_hash": config_hash},
            params={**cfg.model_dump(mode="json"), **meta},
            summary=summary,
            records=records,
            artifacts=list(paths.values()),
        )
    records.sort(key=lambda r: r["seed"])
    wall_s = time.perf_counter() - started
    return AnalysisResult(folder, paths, summary, records, run_id, wall_s)
