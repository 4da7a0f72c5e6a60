"""A retried VeRL job resumes from the newest checkpoint whose steps are all logged in MLflow."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from pdmask.backends.verl.resume import (
    TRACKER,
    ResumePoint,
    damage,
    kept_checkpoints,
    resume_point,
    set_aside_unreadable_tracker,
)


def _checkpoints(folder, steps, tracker):
    for step in steps:
        (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(tracker))


def test_a_step_saved_but_never_logged_is_trained_again(tmp_path):
    _checkpoints(tmp_path, [1, 2], tracker=2)  # died between step 2's save and its metrics
    assert resume_point(str(tmp_path), last_logged=1) == ResumePoint(
        str(tmp_path / "global_step_1")
    )


def test_every_saved_step_logged_leaves_verls_choice(tmp_path):
    _checkpoints(tmp_path, [1, 2], tracker=2)
    assert resume_point(str(tmp_path), last_logged=2) == ResumePoint(None)
    assert resume_point(str(tmp_path / "none"), last_logged=0) == ResumePoint(None)  # first attempt


def test_no_kept_checkpoint_old_enough_names_the_unlogged_steps(tmp_path):
    _checkpoints(tmp_path, [4, 6], tracker=6)
    assert resume_point(str(tmp_path), last_logged=3) == ResumePoint(None, [4, 5, 6])


def test_a_save_past_the_tracker_is_incomplete_and_ignored(tmp_path):
    _checkpoints(tmp_path, [1, 2, 3], tracker=2)  # killed while saving step 3
    assert sorted(kept_checkpoints(str(tmp_path))) == [1, 2]
    assert resume_point(str(tmp_path), last_logged=2) == ResumePoint(None)


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00garbage", b"2\x00\x00"])
def test_an_unreadable_tracker_is_moved_aside_and_verl_starts_from_scratch(tmp_path, content):
    """An empty tracker (a job killed as verl wrote it) or overwritten bytes failed verl's own
    resume in every attempt; moved aside, verl finds no checkpoint and trains from scratch."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    _checkpoints(tmp_path, [1, 2], tracker=2)
    tracker = tmp_path / TRACKER
    tracker.write_bytes(content)
    with pytest.raises(ValueError):
        find_latest_ckpt_path(str(tmp_path))
    line = set_aside_unreadable_tracker(str(tmp_path))
    (aside,) = tmp_path.glob(f"{TRACKER}.corrupt-*")
    assert aside.read_bytes() == content and not tracker.exists()
    assert line.startswith(f"verl's checkpoint tracker {TRACKER} unreadable (")
    assert line.endswith(f"moved aside to {aside.name}: training from scratch")
    assert find_latest_ckpt_path(str(tmp_path)) is None
    assert resume_point(str(tmp_path), last_logged=2) == ResumePoint(None)


def test_a_readable_or_missing_tracker_stays(tmp_path):
    _checkpoints(tmp_path, [1, 2], tracker=2)
    assert set_aside_unreadable_tracker(str(tmp_path)) is None
    assert (tmp_path / TRACKER).read_text() == "2"
    assert set_aside_unreadable_tracker(str(tmp_path / "none")) is None


def _shards(folder, steps, tracker):
    """verl's FSDP checkpoint files, written by torch.save (and a safetensors file of the model)."""
    _checkpoints(folder, steps, tracker)
    for step in steps:
        actor = folder / f"global_step_{step}" / "actor"
        torch.save(
            {"w": torch.arange(4096.0), "b": torch.ones(3)}, actor / "model_world_size_1_rank_0.pt"
        )
        torch.save({"epoch": step}, folder / f"global_step_{step}" / "data.pt")
        header = json.dumps(
            {"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}
        ).encode()
        (actor / "huggingface").mkdir()
        (actor / "huggingface" / "model.safetensors").write_bytes(
            struct.pack("<Q", len(header)) + header + bytes(256)
        )


def _cut(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[: keep if keep >= 0 else len(data) + keep])


@pytest.mark.parametrize(
    "name, keep",
    [
        ("actor/model_world_size_1_rank_0.pt", -1),  # the archive's last byte lost
        ("actor/model_world_size_1_rank_0.pt", 2000),  # cut inside a tensor's data
        ("actor/model_world_size_1_rank_0.pt", 0),  # emptied
        ("data.pt", 40),
        ("actor/huggingface/model.safetensors", -1),  # the last tensor's data short
        ("actor/huggingface/model.safetensors", 12),  # inside the header
        ("actor/huggingface/model.safetensors", 3),
    ],
)
def test_a_file_cut_short_is_damage_and_a_whole_checkpoint_is_not(tmp_path, name, keep):
    _shards(tmp_path, [1], tracker=1)
    step = tmp_path / "global_step_1"
    assert damage(str(step)) is None
    _cut(step / name, keep)
    assert damage(str(step)).startswith(f"{name}: ")
    if name.endswith(".pt"):  # what verl's load would meet in every attempt
        with pytest.raises((RuntimeError, EOFError, OSError)):
            torch.load(step / name, weights_only=False)
    else:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        with pytest.raises(SafetensorError):
            load_file(step / name)


def test_a_file_of_another_format_is_not_judged(tmp_path):
    _shards(tmp_path, [1], tracker=1)
    step = tmp_path / "global_step_1"
    torch.save({"w": torch.ones(2)}, step / "legacy.pt", _use_new_zipfile_serialization=False)
    (step / "actor" / "__0_0.distcp").write_bytes(b"\x00")  # Megatron's distributed format
    assert damage(str(step)) is None


def test_a_damaged_latest_checkpoint_is_moved_aside_and_the_whole_one_before_it_resumes(tmp_path):
    _shards(tmp_path, [1, 2], tracker=2)
    _cut(tmp_path / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt", -30)
    point = resume_point(str(tmp_path), last_logged=2)  # verl would load step 2
    assert point.folder == str(tmp_path / "global_step_1") and point.unlogged == []
    (aside,) = tmp_path.glob("global_step_2.corrupt-*")
    (line,) = point.set_aside
    assert line.startswith("checkpoint global_step_2 damaged (actor/model_world_size_1_rank_0.pt: ")
    assert line.endswith(f"moved aside to {aside.name}")
    assert sorted(kept_checkpoints(str(tmp_path))) == [1]
    # the next attempt: the tracker still names step 2, whose folder is gone; step 1 resumes
    assert resume_point(str(tmp_path), last_logged=2) == ResumePoint(
        str(tmp_path / "global_step_1")
    )
    # with no logged step known, the newest whole checkpoint
    assert resume_point(str(tmp_path), last_logged=None).folder == str(tmp_path / "global_step_1")


def test_no_whole_checkpoint_leaves_nothing_for_verl_to_load(tmp_path):
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    _shards(tmp_path, [1, 2], tracker=2)
    for step in (1, 2):
        _cut(tmp_path / f"global_step_{step}" / "data.pt", 0)
    point = resume_point(str(tmp_path), last_logged=2)
    assert point.folder is None and len(point.set_aside) == 2
    assert find_latest_ckpt_path(str(tmp_path)) is None  # verl trains from scratch


def test_a_damaged_older_checkpoint_does_not_move_verls_choice(tmp_path):
    _shards(tmp_path, [1, 2], tracker=2)
    _cut(tmp_path / "global_step_1" / "data.pt", 10)
    point = resume_point(str(tmp_path), last_logged=2)
    assert point.folder is None and len(point.set_aside) == 1  # verl loads its own, step 2
    assert resume_point(str(tmp_path), last_logged=1) == ResumePoint(None, [2])
