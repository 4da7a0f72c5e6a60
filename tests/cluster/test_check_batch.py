"""`pdm cluster check` asks the job-submitting backend what the nodes must share (its
``JobBatch.node_inputs``), on the cluster profile asked for or a sweep's default one; nothing of
a backend is named in orchestration or the CLI."""

from __future__ import annotations

import pytest

from pdmask.errors import ConfigError
from pdmask.orchestration.jobs.checks import check_batch
from pdmask.registry import Sweep, load_registry, register_backend
from pdmask.registry.backends import VERL, BackendSpec, unregister_backend
from tests.cluster.conftest import ROOT

URI = "http://tracking.example:5000"


@pytest.fixture
def site(tmp_path, monkeypatch):
    for var, folder in (
        ("PDM_VERL_CHECKPOINT_DIR", "ckpt"),
        ("PDM_DATA_DIR", "data"),
        ("PDM_MODEL_ROOT", "models"),
    ):
        monkeypatch.setenv(var, str(tmp_path / folder))
    monkeypatch.setenv("PDM_HOME", str(tmp_path / "home"))
    return tmp_path


def test_the_check_proves_what_the_backends_jobs_read_on_the_default_profile(site):
    from pdmask.backends.verl.jobs_setup import JobSettings
    from pdmask.backends.verl.site_inputs import shared_inputs

    default = Sweep.model_fields["cluster"].default
    inputs = check_batch(load_registry(ROOT), URI).node_inputs()
    assert inputs == shared_inputs(JobSettings.from_env(), default)
    assert inputs["checkpoint_root"] == str(site / "ckpt")
    assert inputs["data_files"][0].startswith(str(site / "data"))
    cpu = check_batch(load_registry(ROOT), URI, "this-machine").node_inputs()
    assert cpu["data_built_here"] and not inputs["data_built_here"]


def test_a_malformed_site_setting_or_two_job_backends_are_refused(site, monkeypatch):
    monkeypatch.setenv("PDM_STALL_SECONDS", "soon")
    with pytest.raises(ConfigError, match="PDM_STALL_SECONDS"):
        check_batch(load_registry(ROOT), URI)
    monkeypatch.delenv("PDM_STALL_SECONDS")
    twin = BackendSpec(**{**VERL.__dict__, "name": "verl-twin"})
    register_backend(twin)
    try:
        with pytest.raises(ConfigError, match="verl-twin"):
            check_batch(load_registry(ROOT), URI)
    finally:
        unregister_backend(twin.name)
