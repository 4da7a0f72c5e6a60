"""Registration in a fresh process, exactly as every Ray worker of a VeRL job gets it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.slow, pytest.mark.processes]

from pdmask.backends.verl import compat  # noqa: E402
from pdmask.backends.verl.file_recipes import FileRecipe  # noqa: E402
from pdmask.errors import BackendUnavailable  # noqa: E402
from tests.methods import project_recipes  # noqa: E402

PROBE = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    {prelude}
    import verl
    t_verl = time.perf_counter() - t0
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    facts = {"losses": sorted(POLICY_LOSS_REGISTRY), "import_verl_s": t_verl,
             "vllm_imported": "vllm" in sys.modules,
             "deferred_imported": any(m.startswith("pdmask.backends.verl.trainer") for m in sys.modules)}
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.workers.rollout.replica import RolloutReplicaRegistry
    facts["trainer"] = get_trainer_cls("pdm_sync").__qualname__
    facts["agent_loop"] = _agent_loop_registry["pdm_single_turn"]["_target_"]
    facts["vllm_loader"] = RolloutReplicaRegistry._registry["vllm"].__module__
    print("FACTS" + json.dumps(facts))
    """
)


def _probe(prelude: str, **env) -> dict:
    code = PROBE.replace("{prelude}", prelude)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("FACTS"))
    return json.loads(line[len("FACTS") :])


ENTRY_POINT = {"VERL_USE_EXTERNAL_PLUGINS": "auto"}  # the installed distribution's verl.plugins
EXTERNAL_MODULES = {
    "VERL_USE_EXTERNAL_PLUGINS": "none",
    "VERL_USE_EXTERNAL_MODULES": "pdmask.backends.verl.plugin",
}


@pytest.mark.parametrize(
    "prelude,env",
    [
        ("", ENTRY_POINT),
        ("", EXTERNAL_MODULES),
        # A pdmask module that itself imports verl first (as Hydra's _target_ import does): verl
        # swallows a plugin's import errors, so a circular import would go unnoticed.
        ("import pdmask.backends.verl.config", ENTRY_POINT),
    ],
    ids=["entry-point", "external-modules", "pdmask-module-first"],
)
def test_plain_import_verl_registers_the_jobs_method(prelude, env):
    recipe = project_recipes()["pdm-agg"]
    job = FileRecipe.of(recipe, recipe.resolve_params({})[0])  # what a job of pdm-agg carries
    facts = _probe(prelude, **env, **job.env())
    assert recipe.verl_name in facts["losses"]
    assert not facts["vllm_imported"]
    assert not facts["deferred_imported"]  # the trainer waits until verl imports its registry
    assert facts["trainer"] == "PDMTrainerSync"
    assert facts["agent_loop"] == "pdmask.backends.verl.agent_loop.PDMSingleTurnAgentLoop"
    assert facts["vllm_loader"] == "pdmask.backends.verl.plugin"


def test_external_modules_fail_loudly():
    env = {
        **os.environ,
        "VERL_USE_EXTERNAL_PLUGINS": "none",
        "VERL_USE_EXTERNAL_MODULES": "pdmask.backends.verl.plugin_typo",
    }
    proc = subprocess.run(
        [sys.executable, "-c", "import verl"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode != 0 and "plugin_typo" in proc.stderr


def test_every_hook_exists_in_the_installed_verl():
    compat.check_all()


def test_missing_hooks_are_named(monkeypatch):
    monkeypatch.setitem(
        compat.HOOKS,
        "plugin",
        (
            "verl.trainer.ppo.core_algos:register_policy_loss",
            "verl.trainer.ppo.core_algos:no_such_hook",
            "verl.workers.utils.losses:ppo_loss(config, renamed_param)",
        ),
    )
    with pytest.raises(BackendUnavailable) as err:
        compat.require(["plugin"])
    message = str(err.value)
    assert "core_algos:no_such_hook" in message and "renamed_param" in message
    assert "register_policy_loss" not in message.replace("core_algos:no_such_hook", "")


def test_other_verl_versions_are_refused(monkeypatch):
    import verl

    monkeypatch.setattr(verl, "__version__", "0.9.2")
    with pytest.raises(BackendUnavailable, match="verl==0.9.1"):
        compat.check_version()
