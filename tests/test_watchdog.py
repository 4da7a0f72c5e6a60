"""pdmask's progress watchdog (shared by Tune trials and VeRL jobs), on a fake clock."""

from __future__ import annotations

import pytest

from pdmask.errors import ConfigError
from pdmask.orchestration.tune.trainable import STALL_SECONDS, STARTUP_SECONDS, trial_bounds
from pdmask.watchdog import Bounds, Watchdog, site_bounds


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_stall_bound_grows_with_the_longest_step_interval_seen():
    clock = Clock()
    dog = Watchdog(Bounds(100.0, 10.0, stall_steps=4), lambda reason: None, clock=clock)
    dog.beat("step 1")
    clock.now += 2.0
    dog.beat("step 2")
    assert dog.stall_bound() == 10.0  # 4 x 2 s is under the floor
    clock.now += 30.0
    assert "stall bound 10 s" in dog.fault()
    dog.beat("step 3")  # a 30 s step: slow, not stalled, and now the pace
    assert dog.stall_bound() == 120.0
    clock.now += 119.0
    assert dog.fault() is None
    clock.now += 2.0
    assert "after step 3" in dog.fault()


def test_a_probe_reason_is_a_fault_at_once():
    dog = Watchdog(Bounds(100.0, 10.0), lambda reason: None, probe=lambda: "engine dead")
    assert dog.fault() == "engine dead"


def test_site_bounds_are_read_and_refused_by_name():
    assert site_bounds({}) == (None, None)
    assert site_bounds({"PDM_STALL_SECONDS": "30", "PDM_STARTUP_SECONDS": " 60 "}) == (30.0, 60.0)
    with pytest.raises(ConfigError) as err:
        site_bounds({"PDM_STALL_SECONDS": "soon", "PDM_STARTUP_SECONDS": "-1"})
    assert "PDM_STALL_SECONDS='soon'" in str(err.value)
    assert "PDM_STARTUP_SECONDS='-1'" in str(err.value)  # both at once
    with pytest.raises(ConfigError):
        site_bounds({"PDM_STALL_SECONDS": "inf"})


def test_tune_trials_get_the_documented_defaults_or_the_sites():
    default = trial_bounds({})
    assert (default.startup_seconds, default.stall_seconds) == (STARTUP_SECONDS, STALL_SECONDS)
    assert default.stall_steps > 1
    site = trial_bounds({"PDM_STALL_SECONDS": "8"})
    assert site.stall_seconds == 8.0 and site.poll_seconds <= 2.0  # polled often enough to matter
