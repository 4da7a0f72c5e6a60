"""A retried VeRL job resumes from the newest checkpoint whose steps are all logged in MLflow."""

from __future__ import annotations

from pdmask.backends.verl.resume import kept_checkpoints, resume_point


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
