"""``pdm sweep verl-smoke --backend verl``: real VeRL training on this machine, end to end.

Real: a Ray head pdmask starts on loopback, verl 0.9.1's ``main_ppo`` as Ray jobs, vLLM's CPU
build serving rollouts through pdmask's top-K server, verl's FSDP2 engine with pdmask's logits
hook and losses, a sqlite MLflow store, the figure. The scratch project adds one method that
exists only as a recipe file (the job carries it to the workers) to the sweep's grid.

What has to hold, besides "it ran": every trial trained something (non-zero advantages, loss and
gradient), the top-K arrived for every token, mu and pi agree on the first mini-batch within the
bf16 mismatch (rollout) or exactly (recompute), validation scores and ``actor/pdm/*`` metrics are
in one run per trial, the run's tags say what the log-probs mean, nothing listened beyond
loopback, and nothing of the sweep is left running.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.cluster.conftest import pdm_cmd, sweep_runs, tracking_client
from tests.registry.test_new_recipe import NEW_RECIPE

from .conftest import cpu_env
from .listening import ListenWatch

CARRIED = "hard-topk-kl"
STEPS = 2
# bf16 vLLM vs bf16 FSDP on the same weights: measured top-K KL ~1e-5 per token (verl-cpu notes);
# bf16 has 8 bits of mantissa (eps 3.9e-3), log-prob errors of a few eps give a KL of
# O(eps^2 * K) ~ 1e-4 at worst; a wrong alignment or temperature gives KL ~ 0.1 or more.
ROLLOUT_KL_BOUND = 1e-3
# recompute: mu is pi_old from the same engine and weights as the first update's forward, so D is
# 0 up to rounding: float32 log-softmax of the same bf16 logits, possibly micro-batched
# differently; a few float32 eps (1.2e-7) per log-prob, weighted by mu (sum 1): ~1e-6 per token,
# and the mean can be slightly negative (measured: +-1e-7).
RECOMPUTE_KL_BOUND = 1e-5


def _add_carried_recipe(project) -> None:
    (project / "recipes" / "hard_topk_kl.py").write_text(NEW_RECIPE)
    sweep = project / "sweeps" / "verl-smoke.yaml"
    text = sweep.read_text()
    assert "    - method: [dppo-topk-kl, pdm-agg]\n" in text
    sweep.write_text(
        text.replace(
            "    - method: [dppo-topk-kl, pdm-agg]\n",
            f"    - method: [dppo-topk-kl, pdm-agg, {CARRIED}]\n",
        )
    )


def _history(client, run, key) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, tiny_cache):
    """One run of the sweep, shared by the tests below (it takes minutes)."""
    import shutil

    from tests.verl_cpu.conftest import ROOT

    project = tmp_path_factory.mktemp("verl-smoke")
    for name in ("recipes", "sweeps", "dashboards"):
        shutil.copytree(ROOT / name, project / name)
    shutil.copytree(tiny_cache, project / ".pdm" / "tiny" / tiny_cache.name)
    _add_carried_recipe(project)
    env = cpu_env(project)
    started = time.time()
    proc = subprocess.Popen(
        pdm_cmd("sweep", "verl-smoke", "--backend", "verl"),
        env=env,
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with ListenWatch(proc.pid) as watch:
        out, _ = proc.communicate(timeout=3600)
    return {
        "project": project,
        "rc": proc.returncode,
        "out": out,
        "seconds": time.time() - started,
        "watch": watch,
    }


def test_every_trial_finishes_with_one_run_and_the_figure(smoke):
    out = smoke["out"]
    assert smoke["rc"] == 0, out[-6000:]
    runs = sweep_runs(smoke["project"], "verl-smoke")
    assert len(runs) == 4 and all(len(r) == 1 for r in runs.values()), "one run per trial"
    methods = sorted(
        (r[0].data.tags["pdm.method"], r[0].data.tags["pdm.mu_source"]) for r in runs.values()
    )
    assert methods == [
        ("dppo-topk-kl", "rollout"),
        (CARRIED, "rollout"),
        ("pdm-agg", "recompute"),
        ("pdm-agg", "rollout"),
    ]
    assert all(r[0].info.status == "FINISHED" for r in runs.values())
    figure = smoke["project"] / ".pdm" / "figures" / "verl-smoke" / "verl-smoke" / "verl-smoke.png"
    assert figure.exists(), out[-3000:]
    print(f"verl-smoke: {smoke['seconds']:.0f} s for 4 trials")


def test_each_trial_trained_something_and_logged_every_step(smoke):
    client = tracking_client(smoke["project"])
    for (run,) in sweep_runs(smoke["project"], "verl-smoke").values():
        name = run.data.tags["pdm.method"] + "/" + run.data.tags["pdm.mu_source"]
        for key in ("actor/pdm/kl_topk_mean", "actor/pdm/masked_frac", "actor/grad_norm"):
            steps = [s for s, _ in _history(client, run, key)]
            assert steps == list(range(1, STEPS + 1)), f"{name}: {key} at steps {steps}"
        val = _history(client, run, "val-core/synth/acc/mean_at_2")
        assert [s for s, _ in val] == [0, STEPS], f"{name}: validation {val}"
        adv_max = [v for _, v in _history(client, run, "critic/advantages/max")]
        adv_min = [v for _, v in _history(client, run, "critic/advantages/min")]
        assert any(v > 0 for v in adv_max) and any(v < 0 for v in adv_min), (
            f"{name}: all advantages 0 -- nothing was trained"
        )
        # GRPO's token-mean loss -A r is ~0 at r ~ 1 (advantages sum to 0 per group); its
        # gradient is not: sum_t -A_t grad log pi(y_t) over different responses.
        assert any(v > 0 for _, v in _history(client, run, "actor/grad_norm")), name
        missing = [v for _, v in _history(client, run, "actor/pdm/topk_missing_frac")]
        assert missing == [0.0] * STEPS, f"{name}: tokens without a top-K {missing}"


def test_mu_and_pi_agree_on_the_first_minibatch(smoke):
    """One mini-batch per step, so step 1's statistics are the first mini-batch's, on-policy:
    vLLM's bf16 top-K vs the trainer's (rollout), pi_old vs pi before any update (recompute)."""
    client = tracking_client(smoke["project"])
    for (run,) in sweep_runs(smoke["project"], "verl-smoke").values():
        kl = dict(_history(client, run, "actor/pdm/kl_topk_mean"))[1]
        masked = dict(_history(client, run, "actor/pdm/masked_frac"))[1]
        if run.data.tags["pdm.mu_source"] == "recompute":
            assert abs(kl) < RECOMPUTE_KL_BOUND, f"recompute: D = {kl} on the first mini-batch"
            assert masked == 0.0
        else:
            assert 0 <= kl < ROLLOUT_KL_BOUND, f"{run.data.tags['pdm.method']}: KL {kl}"


def test_run_tags_record_what_the_logprobs_mean(smoke):
    for (run,) in sweep_runs(smoke["project"], "verl-smoke").values():
        tags = run.data.tags
        assert tags["pdm.verl.logprobs_mode"] == "processed_logprobs"
        assert tags["pdm.verl.temperature"] == "1.0"
        assert tags["pdm.verl.top_p"] == "1.0" and tags["pdm.verl.top_k"] == "-1"
        assert tags["pdm.verl.topk"] == "20"
        assert tags["pdm.verl.device"] == "cpu"
        assert tags["pdm.verl.mu_source"] == tags["pdm.mu_source"]
        assert ("vLLM" in tags["pdm.verl.mu"]) == (tags["pdm.mu_source"] == "rollout")


def test_nothing_listened_beyond_loopback_and_nothing_is_left(smoke):
    watch = smoke["watch"]
    assert watch.samples > 10 and watch.seen, "the watch saw the sweep's servers"
    assert watch.beyond_loopback() == {}, watch.beyond_loopback()
    match = re.search(r"local Ray head on (http://127\.0\.0\.1:\d+)", smoke["out"])
    assert match and "stopped the local Ray head" in smoke["out"]
    port = int(match.group(1).rsplit(":", 1)[1])
    assert not any(a.endswith(f":{port}") for a in _listen_now()), "the head's dashboard is gone"


def _listen_now() -> list[str]:
    from .listening import _listening_inodes

    return list(_listening_inodes().values())
