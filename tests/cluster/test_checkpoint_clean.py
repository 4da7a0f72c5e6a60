"""`pdm clean` on the cluster checkpoint root (``PDM_VERL_CHECKPOINT_DIR/<sweep>/<trial hash>``),
against a real sqlite store: a FINISHED trial keeps its last save's weights, nothing of a
RUNNING, KILLED or FAILED run (or a run this store lacks) is touched."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

SHARDS = ("model", "optim", "extra_state")


def _save(trial: Path, step: int, hf_weights: bool = False) -> None:
    actor = trial / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text("{}")
    if hf_weights:
        (actor / "huggingface" / "model.safetensors").write_bytes(b"h" * 200)
    for kind in SHARDS:
        for rank in range(2):
            (actor / f"{kind}_world_size_2_rank_{rank}.pt").write_bytes(b"x" * 1000)
    (trial / "latest_checkpointed_iteration.txt").write_text(str(step))


def _trial(client, experiment, root: Path, name: str, status: str | None, **save) -> Path:
    trial = root / "main-figure" / f"{name:0<16}"
    for step in (20, 40):
        _save(trial, step, **save)
    if status is not None:
        run = client.create_run(experiment, tags={"pdm.trial_hash": trial.name})
        client.set_terminated(run.info.run_id, status)
    return trial


def _files(trial: Path) -> set[str]:
    return {str(p.relative_to(trial)) for p in trial.rglob("*") if p.is_file()}


def test_clean_keeps_a_finished_trials_last_weights_and_nothing_else_changes(tmp_path):
    from mlflow import MlflowClient

    from pdmask.cli import app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("main-figure")
    root = tmp_path / "share" / "checkpoints"
    done = _trial(client, experiment, root, "aa", "FINISHED")
    hf = _trial(client, experiment, root, "bb", "FINISHED", hf_weights=True)
    held = {
        status: _trial(client, experiment, root, name, status)
        for name, status in (("cc", "RUNNING"), ("dd", "KILLED"), ("ee", "FAILED"))
    }
    held[None] = _trial(client, experiment, root, "ff", None)  # no run in this store
    before = {t: _files(t) for t in held.values()}
    env = {
        "PDM_HOME": str(tmp_path / ".pdm"),
        "PDM_PROJECT": str(tmp_path),
        "PDM_VERL_CHECKPOINT_DIR": str(root),
        "MLFLOW_TRACKING_URI": uri,
    }
    dry = CliRunner().invoke(app, ["clean"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "dry run: nothing deleted" in dry.output
    for status in ("RUNNING", "KILLED", "FAILED"):
        assert f"run {status} (resumable from it)" in dry.output
    assert "no run of this trial in this store" in dry.output
    assert _files(done) == _save_files(20, 40)  # the dry run deleted nothing

    result = CliRunner().invoke(app, ["clean", "--yes"], env=env)
    assert result.exit_code == 0, result.output
    # the last save's model shards and HF config stay; optimizer, extra state, older saves go
    assert _files(done) == {
        "latest_checkpointed_iteration.txt",
        "global_step_40/actor/huggingface/config.json",
        "global_step_40/actor/model_world_size_2_rank_0.pt",
        "global_step_40/actor/model_world_size_2_rank_1.pt",
    }
    # a save that wrote HF weights keeps only those
    assert _files(hf) == {
        "latest_checkpointed_iteration.txt",
        "global_step_40/actor/huggingface/config.json",
        "global_step_40/actor/huggingface/model.safetensors",
    }
    assert {t: _files(t) for t in held.values()} == before
    assert "freed" in result.output


def _save_files(*steps: int) -> set[str]:
    out = {"latest_checkpointed_iteration.txt"}
    for step in steps:
        out.add(f"global_step_{step}/actor/huggingface/config.json")
        out |= {
            f"global_step_{step}/actor/{kind}_world_size_2_rank_{r}.pt"
            for kind in SHARDS
            for r in range(2)
        }
    return out


def _megatron_save(trial: Path, step: int) -> None:
    """A save of verl 0.9.1's Megatron engine (layout v2: ``megatron_checkpoint_manager.py``)."""
    actor = trial / f"global_step_{step}" / "actor"
    files = {
        "model/huggingface/config.json": b"{}",
        "model/huggingface/model.safetensors": b"h" * 200,
        "optimizer/dist_ckpt/__0_0.distcp": b"o" * 1200,
        "optimizer/dist_ckpt/.metadata": b"m",
        "extra/dist_ckpt/__0_0.distcp": b"r" * 10,
        "transformer_config.json": b"{}",
        "ckpt_contents.json": b"{}",
    }
    for name, data in files.items():
        (actor / name).parent.mkdir(parents=True, exist_ok=True)
        (actor / name).write_bytes(data)
    (trial / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_clean_keeps_a_finished_megatron_trials_hf_weights_only(tmp_path):
    """What ``registry/cost.py`` counts for a finished trial trained on Megatron: its last
    save's HF weights (its model slot); the optimizer's and RNG states' shards and older saves
    go, and a KILLED trial's Megatron saves stay whole."""
    from mlflow import MlflowClient

    from pdmask.cli import app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("main-figure")
    root = tmp_path / "share" / "checkpoints"
    trials = {}
    for name, status in (("aa", "FINISHED"), ("bb", "KILLED")):
        trials[status] = root / "main-figure" / f"{name:0<16}"
        for step in (20, 40):
            _megatron_save(trials[status], step)
        run = client.create_run(experiment, tags={"pdm.trial_hash": trials[status].name})
        client.set_terminated(run.info.run_id, status)
    killed = _files(trials["KILLED"])
    env = {
        "PDM_HOME": str(tmp_path / ".pdm"),
        "PDM_PROJECT": str(tmp_path),
        "PDM_VERL_CHECKPOINT_DIR": str(root),
        "MLFLOW_TRACKING_URI": uri,
    }
    result = CliRunner().invoke(app, ["clean", "--yes"], env=env)
    assert result.exit_code == 0, result.output
    assert _files(trials["FINISHED"]) == {
        "latest_checkpointed_iteration.txt",
        "global_step_40/actor/model/huggingface/config.json",
        "global_step_40/actor/model/huggingface/model.safetensors",
        "global_step_40/actor/transformer_config.json",
        "global_step_40/actor/ckpt_contents.json",
    }
    assert _files(trials["KILLED"]) == killed
