"""A retried VeRL job resumes from the newest checkpoint whose steps are all logged in MLflow."""

from __future__ import annotations

import pytest

from pdmask.backends.verl.resume import (
    TRACKER,
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
    folder, unlogged = resume_point(str(tmp_path), last_logged=1)
    assert folder == str(tmp_path / "global_step_1") and unlogged == []


def test_every_saved_step_logged_leaves_verls_choice(tmp_path):
    _checkpoints(tmp_path, [1, 2], tracker=2)
    assert resume_point(str(tmp_path), last_logged=2) == (None, [])
    assert resume_point(str(tmp_path / "none"), last_logged=0) == (None, [])  # first attempt


def test_no_kept_checkpoint_old_enough_names_the_unlogged_steps(tmp_path):
    _checkpoints(tmp_path, [4, 6], tracker=6)
    assert resume_point(str(tmp_path), last_logged=3) == (None, [4, 5, 6])


def test_a_save_past_the_tracker_is_incomplete_and_ignored(tmp_path):
    _checkpoints(tmp_path, [1, 2, 3], tracker=2)  # killed while saving step 3
    assert sorted(kept_checkpoints(str(tmp_path))) == [1, 2]
    assert resume_point(str(tmp_path), last_logged=2) == (None, [])


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
    assert resume_point(str(tmp_path), last_logged=2) == (None, [])


def test_a_readable_or_missing_tracker_stays(tmp_path):
    _checkpoints(tmp_path, [1, 2], tracker=2)
    assert set_aside_unreadable_tracker(str(tmp_path)) is None
    assert (tmp_path / TRACKER).read_text() == "2"
    assert set_aside_unreadable_tracker(str(tmp_path / "none")) is None
