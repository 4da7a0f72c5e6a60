"""Checkpoints that cannot block their trial: written atomically with a digest, read with
``weights_only=True``; a truncated, random or bit-flipped file is moved aside and the trial goes
on from the previous checkpoint or from scratch, saying which."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from pdmask.backends.sim import train_trial
from pdmask.backends.sim.checkpoint import (
    CHECKPOINT_NAME,
    PREVIOUS_NAME,
    load_checkpoint,
    read_checkpoint,
    restore_rng_states,
    save_checkpoint,
)
from pdmask.errors import ConfigError
from tests.methods import method as recipe_method

IDENTITY = {"seed": 3, "delta": 0.15, "lr": None, "task": "digits"}
TIMING = {"perf/tokens_per_s", "sim/wall_s"}


def _save(workdir, step: int) -> None:
    torch.manual_seed(step)
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    save_checkpoint(
        workdir, step=step, identity=IDENTITY, models={"m": model, "opt": optimizer}, extra=step
    )


def _truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random_bytes(path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def _flip_bits(path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = bytes(b ^ 0xFF for b in data[middle : middle + 4])
    path.write_bytes(bytes(data))


DAMAGE = {"truncated": _truncate, "random bytes": _random_bytes, "bits flipped": _flip_bits}


def test_a_checkpoint_loads_with_weights_only_and_restores_every_random_stream(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(tmp_path, step=5, identity=IDENTITY, models={})
    expected = random.random(), np.random.rand(4), torch.rand(4)
    torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)  # no global beyond the defaults
    restore_rng_states(read_checkpoint(tmp_path / CHECKPOINT_NAME)["rng"])
    again = random.random(), np.random.rand(4), torch.rand(4)
    assert again[0] == expected[0] and np.array_equal(again[1], expected[1])
    assert torch.equal(again[2], expected[2])


def test_the_checkpoint_replaced_is_kept_as_the_previous_one(tmp_path):
    _save(tmp_path, 2)
    assert not (tmp_path / PREVIOUS_NAME).exists()
    _save(tmp_path, 4)
    assert read_checkpoint(tmp_path / CHECKPOINT_NAME)["step"] == 4
    assert read_checkpoint(tmp_path / PREVIOUS_NAME)["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [PREVIOUS_NAME, CHECKPOINT_NAME]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_an_unreadable_checkpoint_is_moved_aside_and_the_previous_one_resumes(tmp_path, damage):
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    bad = (tmp_path / CHECKPOINT_NAME).read_bytes()
    DAMAGE[damage](tmp_path / CHECKPOINT_NAME)
    with pytest.raises(Exception):  # noqa: B017 (each damage fails in its own way)
        read_checkpoint(tmp_path / CHECKPOINT_NAME)
    lines: list[str] = []
    payload = load_checkpoint(tmp_path, IDENTITY, lines.append)
    assert payload["step"] == 2 and payload["extra"] == 2
    (aside,) = tmp_path.glob(f"{CHECKPOINT_NAME}.corrupt-*")
    assert aside.read_bytes() != bad  # the damaged file itself, kept for a look
    assert not (tmp_path / CHECKPOINT_NAME).exists()
    (line,) = lines
    assert line.startswith(f"resuming from {PREVIOUS_NAME} (step 2): {CHECKPOINT_NAME} unreadable")
    assert line.endswith(f"moved aside to {aside.name}")


def test_with_no_readable_checkpoint_left_the_trial_starts_from_scratch(tmp_path):
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    _truncate(tmp_path / CHECKPOINT_NAME)
    _random_bytes(tmp_path / PREVIOUS_NAME)
    lines: list[str] = []
    assert load_checkpoint(tmp_path, IDENTITY, lines.append) is None
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 2
    (line,) = lines
    assert line.startswith("training from scratch, no readable checkpoint left: ")
    assert f"{CHECKPOINT_NAME} unreadable" in line and f"{PREVIOUS_NAME} unreadable" in line
    assert load_checkpoint(tmp_path, IDENTITY, lines.append) is None and len(lines) == 1


def test_without_a_listener_the_line_goes_to_stderr(tmp_path, capsys):
    _save(tmp_path, 2)
    _random_bytes(tmp_path / CHECKPOINT_NAME)
    assert load_checkpoint(tmp_path, IDENTITY) is None
    err = capsys.readouterr().err
    assert err.startswith("pdmask: training from scratch, no readable checkpoint left: ")


def test_another_trials_checkpoint_is_still_refused(tmp_path):
    _save(tmp_path, 2)
    with pytest.raises(ConfigError, match="belongs to another trial config"):
        load_checkpoint(tmp_path, {**IDENTITY, "seed": 4})


def test_a_checkpoint_written_before_digests_still_resumes(tmp_path):
    """Format 1: the state's torch.save alone, numpy's RNG state as arrays."""
    state = {
        "step": 7,
        "identity": IDENTITY,
        "state": {},
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        },
    }
    torch.save(state, tmp_path / CHECKPOINT_NAME)
    payload = load_checkpoint(tmp_path, IDENTITY)
    assert payload["step"] == 7
    restore_rng_states(payload["rng"])


def _train(cfg, workdir, lines=None):
    reports: list[tuple[int, dict]] = []
    final = train_trial(
        cfg,
        mask_fn=recipe_method("pdm-agg", delta=0.15),
        reporter=lambda step, metrics: reports.append(
            (step, {k: v for k, v in metrics.items() if k not in TIMING})
        ),
        workdir=workdir,
        note=None if lines is None else lines.append,
    )
    return reports, final


@pytest.mark.slow
def test_a_trial_with_damaged_checkpoints_finishes_on_rerun(smoke_config, tmp_path):
    """Acceptance on a real trial: the rerun resumes from the previous checkpoint (a truncated
    last one) or from scratch (random bytes in both), reports what an undamaged trial reported,
    finishes, and keeps the bad files aside."""
    cfg = smoke_config(steps=4, checkpoint_every=2)
    reference, _ = _train(cfg, tmp_path)
    by_step = dict(reference)
    assert read_checkpoint(tmp_path / PREVIOUS_NAME)["step"] == 2

    _truncate(tmp_path / CHECKPOINT_NAME)
    lines: list[str] = []
    resumed, final = _train(cfg, tmp_path, lines)
    assert [step for step, _ in resumed] == [3, 4]
    assert all(metrics == by_step[step] for step, metrics in resumed)
    assert final["sim/steps_done"] == 4
    assert len(lines) == 1 and lines[0].startswith("resuming from checkpoint.prev.pt (step 2)")

    _random_bytes(tmp_path / CHECKPOINT_NAME)
    _random_bytes(tmp_path / PREVIOUS_NAME)
    lines.clear()
    scratch, _ = _train(cfg, tmp_path, lines)
    assert scratch == reference
    assert len(lines) == 1 and lines[0].startswith("training from scratch")
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 3
    assert read_checkpoint(tmp_path / CHECKPOINT_NAME)["step"] == 4
