"""``pdm sweep verl-smoke --backend verl``: real VeRL training on this machine, end to end, faults
included. One sweep (the expensive part: a Ray head, vLLM engines, verl jobs) feeds every test here.

Real: a Ray head pdmask starts on loopback, verl 0.9.1's ``main_ppo`` as Ray jobs, vLLM's CPU
build serving rollouts through pdmask's top-K server, verl's FSDP2 engine with pdmask's logits
hook and losses, a real ``mlflow server`` on a sqlite store (behind a loopback proxy that can
refuse a run's metric writes), the figure. Three trials, each job start paid once:
``pdm-agg`` and ``ent-bonus`` (in place of the sweep's ``dppo-topk-kl``, the same code path as
pdm-agg's with another direction test: ent-bonus's exact entropy and its gradient come out of the
logits hook and reach the model) with mu from vLLM's rollout, and a method that exists only as a
recipe file (the job carries it to the workers) with mu recomputed by the trainer, in place of
the sweep's ``pdm-agg`` recompute trial (the mu source does not depend on the method). Each
trial meets a fault once its first step is logged (``faults.py``):

- ``pdm-agg`` (mu from the rollout): its job is stopped through Ray's job API, as an operator or
  a node failure would; pdmask marks the attempt failed, resubmits it as attempt 2, verl resumes
  from a checkpoint into the same MLflow run, and every metric has every step exactly once;
- ``ent-bonus``: its vLLM engine core is SIGKILLed; the job must end within a bound (the job's
  watchdog, ``backends/verl/watchdog.py``, or verl's own error), the engine's failure named in the
  attempt's reason, and attempt 2 finishes the trial the same way;
- the recipe-file method (mu recomputed): the tracking server refuses its run's metric writes
  until the attempt ends; verl's MLflow adapter would drop the step and train on, closing the run
  FINISHED without it: pdmask's guard ends the attempt FAILED, ``incomplete``, naming the step,
  and attempt 2 resumes from the checkpoint before it and logs it (every step once).

What has to hold, besides "it ran": every trial trained something (non-zero advantages, loss and
gradient), the top-K arrived for every token, mu and pi agree on the first mini-batch within the
bf16 mismatch (rollout) or exactly (recompute), validation scores and ``actor/pdm/*`` metrics are
in one run per trial, the run's tags say what the log-probs mean, nothing listened beyond
loopback, and nothing of the sweep is left running.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.cluster.conftest import sweep_runs, tracking_client
from tests.cluster.two_node import _get, start_tracking_server, wait_until
from tests.registry.test_new_recipe import NEW_RECIPE

from .conftest import ROLLOUT_KL_BOUND
from .faults import FaultInjector
from .listening import ListenWatch
from .refusing_proxy import RefusingProxy
from .sweep_run import assert_loopback_only_and_head_stopped, history, scratch_project, verl_sweep

SWEEP = "verl-smoke"
CARRIED = "hard-topk-kl"
STEPS = 3  # a fault lands after step 1; two more steps leave the retry something to resume
NEW_METHOD = "ent-bonus"  # issue 24's recipe whose loss needs the hook's differentiable entropy
FAULTS = {"pdm-agg": "stop", NEW_METHOD: "engine", CARRIED: "tracking"}
# The sweep's own bound: 3 trials and 3 retries, ~2-5 min each on 2 loaded cores.
SWEEP_TIMEOUT_S = 2400
# A job whose engine died ends within the watchdog's poll (10 s) plus a server round trip and
# Ray's job teardown; verl's own error, when it comes first, is faster still.
ENGINE_FAULT_BOUND_S = 180
# The watchdog's stall bound for these jobs (PDM_STALL_SECONDS): a job that stopped without
# its engine dying must not hold the suite for the default 10 minutes.
STALL_S = "300"
# MLflow retries a refused (503) request inside each call, 7 times with a backoff of minutes by
# default; two quick retries bound the refused attempt to seconds (verl's 3 tries x 3 requests),
# and still let a request the loaded server answers late through.
MLFLOW_PATIENCE = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
}
KEYS = ("actor/pdm/kl_topk_mean", "actor/pg_loss", "critic/score/mean")
# recompute: mu is pi_old from the same engine and weights as the first update's forward, so D is
# 0 up to rounding: float32 log-softmax of the same bf16 logits, possibly micro-batched
# differently; a few float32 eps (1.2e-7) per log-prob, weighted by mu (sum 1): ~1e-6 per token,
# and the mean can be slightly negative (measured: +-1e-7).
RECOMPUTE_KL_BOUND = 1e-5

pytestmark = pytest.mark.timeout(SWEEP_TIMEOUT_S + 300)


def _edit(project):
    """The scratch project's sweep and recipes as this module runs them."""
    (project / "recipes" / "hard_topk_kl.py").write_text(NEW_RECIPE)
    sweep = project / "sweeps" / f"{SWEEP}.yaml"
    text = sweep.read_text()
    for old, new in (
        (
            "    - method: [pdm-agg]\n      model: [qwen3-tiny]\n      precision: [bf16]\n"
            "      delta: [0.15]\n      mu_source: [recompute]\n",
            f"    - method: [{CARRIED}]\n      model: [qwen3-tiny]\n      precision: [bf16]\n"
            "      delta: [0.15]\n      mu_source: [recompute]\n",
        ),
        ("    - method: [dppo-topk-kl, pdm-agg]\n", f"    - method: [{NEW_METHOD}, pdm-agg]\n"),
        ("\nsteps: 2\n", f"\nsteps: {STEPS}\n"),
        ("\nretries: 1\n", "\nretries: 1\n"),
    ):
        assert old in text, f"{sweep.name} no longer has {old!r}"
        text = text.replace(old, new)
    sweep.write_text(text)


@pytest.fixture(scope="module")
def tracking_proxy(tmp_path_factory):
    """A real ``mlflow server`` on a scratch project's own store, and the refusing proxy in front
    of it: (the project, the proxy). The tests read the store as the project's."""
    project = scratch_project(tmp_path_factory, SWEEP)
    (project / ".pdm").mkdir()
    server = start_tracking_server(store=project / ".pdm" / "mlflow.db")
    try:
        uri = server.extra["uri"]
        wait_until(server, lambda: _get(f"{uri}/health") == 200, "the MLflow server")
        with RefusingProxy(uri) as proxy:
            yield project, proxy
    finally:
        server.stop()


@pytest.fixture(scope="module")
def smoke(tracking_proxy, tiny_cache):
    """One run of the sweep with its three faults, shared by the tests below (minutes)."""
    project, proxy = tracking_proxy
    _edit(project)

    def address() -> str:
        match = re.search(r"on (http://127\.0\.0\.1:\d+)", (project / "pdm.log").read_text())
        assert match, "the sweep has not printed its Ray head's address"
        return match.group(1)

    env = {"PDM_STALL_SECONDS": STALL_S, "MLFLOW_TRACKING_URI": proxy.uri, **MLFLOW_PATIENCE}
    with verl_sweep(project, SWEEP, **env) as sweep:
        client = tracking_client(project)
        injector = FaultInjector(sweep.proc.pid, client, SWEEP, address, FAULTS, proxy)
        with ListenWatch(sweep.proc.pid) as watch, injector:
            sweep.proc.wait(timeout=SWEEP_TIMEOUT_S)
    return sweep.outcome(
        watch=watch,
        injected={i.kind: i for i in injector.injected},
        injector_errors=injector.errors,
        refusals=list(proxy.refusals),
    )


def _runs(smoke) -> dict[tuple[str, str], object]:
    """The sweep's one run per trial, by (method, mu source)."""
    runs = sweep_runs(smoke["project"], SWEEP)
    assert all(len(r) == 1 for r in runs.values()), "one run per trial"
    return {
        (r[0].data.tags["pdm.method"], r[0].data.tags["pdm.mu_source"]): r[0] for r in runs.values()
    }


def test_every_trial_finishes_with_one_run_and_the_figure(smoke):
    out = smoke["out"]
    assert smoke["rc"] == 0, out[-6000:]
    assert not smoke["injector_errors"], smoke["injector_errors"]
    assert sorted(smoke["injected"]) == ["engine", "stop", "tracking"], "every fault injected"
    runs = _runs(smoke)
    assert sorted(runs) == sorted(
        [(NEW_METHOD, "rollout"), (CARRIED, "recompute"), ("pdm-agg", "rollout")]
    )
    assert all(r.info.status == "FINISHED" for r in runs.values())
    figure = smoke["project"] / ".pdm" / "figures" / SWEEP / SWEEP / f"{SWEEP}.png"
    assert figure.exists(), out[-3000:]
    print(f"{SWEEP}: {smoke['seconds']:.0f} s for 3 trials and 3 retries")


def test_each_trial_trained_something_and_logged_every_step_once(smoke):
    client = tracking_client(smoke["project"])
    for (method, mu_source), run in _runs(smoke).items():
        name = f"{method}/{mu_source}"
        for key in (*KEYS, "actor/pdm/masked_frac", "actor/grad_norm"):
            steps = [s for s, _ in history(client, run, key)]
            assert steps == list(range(1, STEPS + 1)), f"{name}: {key} at steps {steps}"
        val = [s for s, _ in history(client, run, "val-core/synth/acc/mean_at_2")]
        # before training and at the last step; a resumed attempt also validates where it resumes
        assert val[0] == 0 and val[-1] == STEPS and val == sorted(set(val)), f"{name}: {val}"
        log = f"{run.data.tags['mlflow.runName']}.{run.data.tags['pdm.trial_hash'][:8]}.log"
        text = (smoke["project"] / ".pdm" / "logs" / SWEEP / log).read_text()  # its trial log
        assert re.search(rf"step {STEPS}/{STEPS}: avg@2 [01]\.\d{{3}}, masked ", text), name
        adv_max = [v for _, v in history(client, run, "critic/advantages/max")]
        adv_min = [v for _, v in history(client, run, "critic/advantages/min")]
        assert any(v > 0 for v in adv_max) and any(v < 0 for v in adv_min), (
            f"{name}: all advantages 0 -- nothing was trained"
        )
        # GRPO's token-mean loss -A r is ~0 at r ~ 1 (advantages sum to 0 per group); its
        # gradient is not: sum_t -A_t grad log pi(y_t) over different responses.
        assert any(v > 0 for _, v in history(client, run, "actor/grad_norm")), name
        # the policy's entropy in nats, every step (pdmask's hook: bypass mode logs none in verl)
        entropy = history(client, run, "actor/entropy")
        assert [s for s, _ in entropy] == list(range(1, STEPS + 1)), f"{name}: {entropy}"
        assert all(0 < v <= math.log(512) for _, v in entropy), f"{name}: {entropy}"
        missing = [v for _, v in history(client, run, "actor/pdm/topk_missing_frac")]
        assert missing == [0.0] * STEPS, f"{name}: tokens without a top-K {missing}"
        if method == NEW_METHOD:  # its loss ran on verl: the recipe's own metric, every step
            entropy = history(client, run, "actor/pdm/recipe/masked_entropy")
            assert [s for s, _ in entropy] == list(range(1, STEPS + 1)), f"{name}: {entropy}"
            assert all(v >= 0 for _, v in entropy), f"{name}: {entropy}"


def test_mu_and_pi_agree_on_the_first_minibatch(smoke):
    """One mini-batch per step, so step 1's statistics are the first mini-batch's, on-policy:
    vLLM's bf16 top-K vs the trainer's (rollout), pi_old vs pi before any update (recompute)."""
    client = tracking_client(smoke["project"])
    for (method, mu_source), run in _runs(smoke).items():
        kl = dict(history(client, run, "actor/pdm/kl_topk_mean"))[1]
        masked = dict(history(client, run, "actor/pdm/masked_frac"))[1]
        if mu_source == "recompute":
            assert abs(kl) < RECOMPUTE_KL_BOUND, f"recompute: D = {kl} on the first mini-batch"
            assert masked == 0.0
        else:
            assert 0 <= kl < ROLLOUT_KL_BOUND, f"{method}: KL {kl}"


def test_run_tags_record_what_the_logprobs_mean(smoke):
    for (_, mu_source), run in _runs(smoke).items():
        tags = run.data.tags
        assert tags["pdm.verl.logprobs_mode"] == "processed_logprobs"
        assert tags["pdm.verl.temperature"] == "1.0"
        assert tags["pdm.verl.top_p"] == "1.0" and tags["pdm.verl.top_k"] == "-1"
        assert tags["pdm.verl.topk"] == "20"
        assert tags["pdm.verl.device"] == "cpu"
        assert tags["pdm.verl.mu_source"] == mu_source
        assert ("vLLM" in tags["pdm.verl.mu"]) == (mu_source == "rollout")


def _resumed_attempt(smoke, kind: str):
    """The faulted trial's run, its first attempt's id, and its checkpoint folder."""
    fault = smoke["injected"][kind]
    run = tracking_client(smoke["project"]).get_run(fault.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["pdm.attempts"] == "2"
    assert fault.submission_id.endswith("-a1")
    assert run.data.tags["pdm.ray_job"] == fault.submission_id[: -len("a1")] + "a2"
    trial_dir = (
        smoke["project"] / ".pdm" / "checkpoints" / "verl" / SWEEP / run.data.tags["pdm.trial_hash"]
    )
    assert (trial_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    return fault, run


def test_a_stopped_job_resumes_from_its_checkpoint_into_the_same_run(smoke):
    fault, run = _resumed_attempt(smoke, "stop")
    out = smoke["out"]
    assert f"FAILED {fault.submission_id}: " in out and "retrying" in out, out[-3000:]
    assert fault.ended_status == "STOPPED", fault
    assert fault.resumed_from is not None and fault.resumed_from >= 1, fault


def test_a_dead_vllm_engine_fails_the_attempt_within_the_bound_with_its_error(smoke):
    fault, run = _resumed_attempt(smoke, "engine")
    failures = json.loads(run.data.tags["pdm.failures"])
    first = next(f for f in failures if f["attempt"] == 1)
    assert re.search(r"vLLM engine|EngineDead|EngineCore", first["reason"]), first["reason"]
    assert fault.ended_status == "FAILED", fault
    took = fault.ended_at - fault.at
    assert 0 < took <= ENGINE_FAULT_BOUND_S, f"the job ended {took:.0f} s after its engine died"
    assert fault.resumed_from is not None and fault.resumed_from >= 1, fault
    print(f"engine killed: the job ended {took:.0f} s later; reason: {first['reason'][:200]}")


def test_a_refused_metric_write_fails_the_attempt_and_the_retry_logs_the_step(smoke):
    """The attempt whose metric writes the tracking server refused is not FINISHED: FAILED,
    ``incomplete``, the step named; its retry resumes from the step before and the run ends
    complete (every step once: ``test_each_trial_trained_something_and_logged_every_step_once``)."""
    fault, run = _resumed_attempt(smoke, "tracking")
    refused = sorted({s for run_id, steps in smoke["refusals"] for s in steps})
    assert refused and {r for r, _ in smoke["refusals"]} == {fault.run_id}, smoke["refusals"]
    first = next(f for f in json.loads(run.data.tags["pdm.failures"]) if f["attempt"] == 1)
    assert first["kind"] == "incomplete", first
    assert f"refused step {refused[0]}'s metrics" in first["reason"], first["reason"]
    assert fault.ended_status == "FAILED" and fault.run_status_at_end == "FAILED", fault
    assert fault.resumed_from == refused[0] - 1, fault  # the step before: it is logged again
    print(f"refused steps {refused} ({len(smoke['refusals'])} requests); retry from {fault}")


def test_nothing_listened_beyond_loopback_and_nothing_is_left(smoke):
    assert_loopback_only_and_head_stopped(smoke["watch"], smoke["out"])
