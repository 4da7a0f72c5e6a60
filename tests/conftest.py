"""Suite-wide settings: the shared model cache, and the environment CI varies between its passes.

``PDM_TEST_TORCH_THREADS=N``: torch's intra-op threads for the whole session (CI's second pass
uses 1, with another ``PYTHONHASHSEED``): a result that holds only at one thread count, or only
with one reduction order, is a test tuned to one machine.

``model_cache``: every test (and every ``pdm`` it starts) builds the models pdmask makes itself --
the embedded backend's base models, the tiny Qwen3 -- into one folder per test run, shared by
the xdist workers (``PDM_MODEL_CACHE``, ``paths.model_cache_dir``): each model is built once per
run, keyed by the hash of what shapes it, instead of once per test project.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

THREADS_ENV = "PDM_TEST_TORCH_THREADS"


def pytest_configure(config) -> None:
    # Tests send Ctrl-C (SIGINT) to the pdm processes they start. A suite launched as a background
    # job (`cmd &` in a script, nohup) inherits SIGINT ignored, every child with it, and Python
    # then installs no KeyboardInterrupt handler: a handler here (reset to the default on exec)
    # gives the children a SIGINT that works, however the suite was started.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    threads = os.environ.get(THREADS_ENV)
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def pytest_report_header(config) -> str:
    return (
        f"{THREADS_ENV}={os.environ.get(THREADS_ENV, '(unset)')} "
        f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', '(random)')}"
    )


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory) -> Path:
    """The run's model cache (one folder for all xdist workers of the run)."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base folder is <run's base>/popen-gwN: the parent is the run's.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "model-cache"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PDM_MODEL_CACHE", str(folder))
        yield folder


# The order in which the xdist workers start the modules (``--dist loadfile``: a module is one
# unit, so its module-scoped fixtures, e.g. a shared sweep, run once; with
# ``--no-loadscope-reorder``, set in pyproject.toml): longest first, measured (tests/README.md).
# The real-VeRL sweep goes first, so one worker starts it at once and holds it alone (xdist hands
# a worker more work only when two or fewer of its tests are pending) while the other takes the
# rest; every other module follows by its measured time, the rest in collection order.
LONGEST_FIRST = (
    "verl_cpu/test_verl_sweep.py",
    "verl_cpu/test_verl_cluster.py",
    "verl_cpu/test_verl_shape.py",
    "orchestration/test_signals.py",
    "orchestration/test_sweep_runs.py",
    "verl_cpu/test_weight_sync.py",
    "recipes/test_new_methods_e2e.py",
    "orchestration/test_trial_runs.py",
    "orchestration/test_stalls.py",
    "orchestration/test_results_and_clean.py",
    "orchestration/test_trial_logs.py",
    "orchestration/test_lost_cluster.py",
    "orchestration/test_environment_errors.py",
    "benchmarks/test_gpu_check.py",
    "cluster/test_ray_jobs.py",
    "library/test_notebook_sweep.py",
    "verl_cpu/test_vllm_topk.py",
    "orchestration/test_sweep_figures.py",
    "analysis/test_cli.py",
    "verl/test_plugin.py",
    "analysis/test_steps.py",
    "sim/test_trainer.py",
    "cli/test_ui.py",
    "library/test_third_backend.py",
    "tracking/test_store_checks.py",
    "verl/test_cpu_profile.py",
    "recipes/test_baselines.py",
    "sim/test_rollout.py",
)
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def main_figure_store(tmp_path_factory):
    """``(client, experiment id)``: a real sqlite MLflow store with the experiment main-figure,
    one per module (creating a store takes seconds); each test its own trial's run."""
    from pdmask.tracking import ensure_experiment, open_client

    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDM_HOME", str(home))
        client = open_client(f"sqlite:///{home / 'mlflow.db'}")
        yield client, ensure_experiment(client, "main-figure")


def _module(item) -> str:
    return Path(item.fspath).relative_to(TESTS).as_posix()


def pytest_collection_modifyitems(config, items):
    """The modules in ``LONGEST_FIRST`` order, the rest after them in collection order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))
