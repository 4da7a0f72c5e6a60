"""``pdm sweep verl-shape --backend verl``: the shape of the paper's cluster runs, for real, on this
machine's CPU cores. One trial, one job start; every test here reads what it left.

Real, as in ``test_verl_sweep.py`` (a Ray head pdmask starts on loopback, verl 0.9.1's
``main_ppo`` as a Ray job, vLLM's CPU build behind pdmask's top-K server, a sqlite MLflow store),
and in the shape the 4 x 8 H20 jobs have and the smoke sweep does not:

- a mixture-of-experts model: the tiny Qwen3-MoE pdmask builds (``tiny_model.py``: 4 experts,
  top-2 routing, the experts packed as transformers 5 holds them);
- two training ranks: verl's FSDP2 engine in two processes over gloo (the ``this-machine``
  profile's two logical GPUs, ``trainer.n_gpus_per_node=2``);
- one vLLM engine at tensor parallel 2 (two worker processes), started on dummy weights, into
  which verl streams the trainer's weights before every rollout, the experts unfused per expert
  (``unfuse_moe_params``) into vLLM's Qwen3-MoE loader;
- pdmask's logits hook and ``pdm-agg``'s loss on the MoE's logits.

What has to hold: the trial finishes in one run with that shape in the config verl ran; both ranks
trained (each one's optimizer shard stepped, its experts' shard got gradients); the mask's
metrics at every step with a top-K for every token, their token means scaled right across the two
ranks; mu (vLLM) and pi (the trainer) agree on each step's first mini-batch within the bf16 bound,
which an engine left on its dummy, stale or unpacked expert weights is nats away from; vLLM ran at
TP 2; nothing listened beyond loopback and nothing of the sweep is left running.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cluster.conftest import sweep_runs, tracking_client

from .conftest import ROLLOUT_KL_BOUND
from .listening import ListenWatch, is_alive_as
from .sweep_run import assert_loopback_only_and_head_stopped, history, scratch_project, verl_sweep

SWEEP = "verl-shape"
MODEL = "qwen3-tiny-moe"
STEPS = 2  # step 2's rollout comes from weights synced after step 1's update
RANKS = 2
ROLLOUT_TP = 2
# The sweep's own bound: one job (~3-6 min on 2 loaded cores) and the model's build.
SWEEP_TIMEOUT_S = 1500
STALL_S = "300"  # PDM_STALL_SECONDS: a job that stops must not hold the suite for 10 minutes
# A token mean of a top-K mass lies in (0, 1]; float32 sums of 20 probabilities round by ~1e-6.
# The warmed-up tiny model puts > 0.99 of its mass on its top 20 of 512 tokens (measured 0.9995+):
# metrics summed instead of averaged over the two ranks would read ~2, halved ones ~0.5.
MASS_RANGE = (0.75, 1.0 + 1e-5)

pytestmark = [pytest.mark.timeout(SWEEP_TIMEOUT_S + 300), pytest.mark.processes]


@pytest.fixture(scope="module")
def shape(tmp_path_factory, tiny_moe_cache):
    """One run of the sweep, watched (minutes)."""
    from pdmask.backends.verl.tracking import CONFIG_ARTIFACT

    project = scratch_project(tmp_path_factory, SWEEP)
    with (
        verl_sweep(project, SWEEP, PDM_STALL_SECONDS=STALL_S) as sweep,
        ListenWatch(sweep.proc.pid) as watch,
    ):
        sweep.proc.wait(timeout=SWEEP_TIMEOUT_S)
    runs = sweep_runs(project, SWEEP)
    assert len(runs) == 1 and all(len(r) == 1 for r in runs.values()), sweep.log.read_text()[-6000:]
    run = next(iter(runs.values()))[0]
    client = tracking_client(project)
    artifact = Path(client.download_artifacts(run.info.run_id, CONFIG_ARTIFACT, str(project)))
    trial_dir = project / ".pdm" / "checkpoints" / "verl" / SWEEP / run.data.tags["pdm.trial_hash"]
    return sweep.outcome(
        watch=watch,
        run=run,
        config=yaml.safe_load(artifact.read_text()),
        actor=trial_dir / f"global_step_{STEPS}" / "actor",
    )


def _steps(shape, key) -> list[tuple[int, float]]:
    return history(tracking_client(shape["project"]), shape["run"], key)


def test_the_trial_finishes_in_one_run_with_the_shape_verl_ran(shape):
    assert shape["rc"] == 0, shape["out"][-6000:]
    run = shape["run"]
    assert run.info.status == "FINISHED"
    assert run.data.tags["pdm.model"] == MODEL and run.data.tags["pdm.attempts"] == "1"
    assert run.data.tags["pdm.verl.resources"] == f"1x{RANKS} CPU"
    config = shape["config"]
    assert config["trainer"]["nnodes"] == 1 and config["trainer"]["n_gpus_per_node"] == RANKS
    rollout = config["actor_rollout_ref"]["rollout"]
    assert rollout["tensor_model_parallel_size"] == ROLLOUT_TP
    # vLLM starts on random weights: what it samples from comes through the weight sync
    assert rollout["load_format"] == "dummy"
    model_dir = config["actor_rollout_ref"]["model"]["path"]
    hf_config = json.loads((Path(model_dir) / "config.json").read_text())
    assert hf_config["model_type"] == "qwen3_moe" and hf_config["num_local_experts"] == 4, hf_config
    print(f"{SWEEP}: {shape['seconds']:.0f} s for one trial ({RANKS} ranks, TP {ROLLOUT_TP})")


def test_both_ranks_trained(shape):
    """Each rank saved its own shard of the model and optimizer; each shard's Adam state stepped
    once per training step, and the rank's half of the experts received gradients."""
    import torch

    actor = shape["actor"]
    for rank in range(RANKS):
        for part in ("model", "optim"):
            assert (actor / f"{part}_world_size_{RANKS}_rank_{rank}.pt").exists(), rank
        optim = torch.load(
            actor / f"optim_world_size_{RANKS}_rank_{rank}.pt",
            map_location="cpu",
            weights_only=False,
        )
        states = list(optim["state"].values())
        assert states and {float(s["step"]) for s in states} == {float(STEPS)}, rank
        # transformers 5's packed experts, the only 3-D parameters: [experts, out, in]
        experts = [s["exp_avg"] for s in states if s["exp_avg"].ndim == 3]
        assert len(experts) == 2 * 2, f"rank {rank}: gate_up_proj + down_proj per layer"
        for moment in experts:
            local = moment.to_local()
            assert local.shape[0] == 4 // RANKS, f"rank {rank} holds half the experts"
            assert local.abs().sum() > 0, f"rank {rank}: its experts got no gradient"
    # verl balanced each step's batch over the data-parallel ranks: tokens per rank = total / 2
    total = dict(_steps(shape, "perf/total_num_tokens"))
    per_rank = dict(_steps(shape, "global_seqlen/mean"))
    assert sorted(total) == list(range(1, STEPS + 1))
    assert all(per_rank[s] * RANKS == total[s] for s in total), (per_rank, total)
    watch = shape["watch"]
    workers = watch.pids_titled("ray::WorkerDict")
    seen = {p: (watch.parents.get(p), sorted(watch.titles[p])) for p in workers}
    assert len(workers) == RANKS, f"training worker processes (pid: parent, titles): {seen}"


def test_the_mask_ran_on_the_moe_logits_at_every_step(shape):
    for key in (
        "actor/pdm/kl_topk_mean",
        "actor/pdm/masked_frac",
        "actor/pdm/ratio_mean",
        "actor/pg_loss",
        "actor/grad_norm",
    ):
        steps = [s for s, _ in _steps(shape, key)]
        assert steps == list(range(1, STEPS + 1)), f"{key} at steps {steps}"
    missing = [v for _, v in _steps(shape, "actor/pdm/topk_missing_frac")]
    assert missing == [0.0] * STEPS, f"tokens without a top-K: {missing}"
    for key in ("actor/pdm/mu_topk_mass", "actor/pdm/pi_topk_mass"):
        values = [v for _, v in _steps(shape, key)]
        assert all(MASS_RANGE[0] < v <= MASS_RANGE[1] for v in values), f"{key}: {values}"
    assert any(v > 0 for _, v in _steps(shape, "critic/advantages/max")), "no advantage > 0"
    assert any(v < 0 for _, v in _steps(shape, "critic/advantages/min")), "no advantage < 0"
    assert any(v > 0 for _, v in _steps(shape, "actor/grad_norm")), "nothing was trained"


def test_the_weight_sync_moved_the_moe_into_vllm(shape):
    """One mini-batch per step: each step's statistics compare vLLM's top-K with the trainer's on
    the weights just synced (step 1: from the checkpoint, into an engine started on random
    weights; step 2: after step 1's update)."""
    kl = _steps(shape, "actor/pdm/kl_topk_mean")
    assert all(0 <= v < ROLLOUT_KL_BOUND for _, v in kl), f"top-K KL per step: {kl}"


def test_vllm_ran_at_tensor_parallel_2(shape):
    watch = shape["watch"]
    ranks = {title for pid in watch.pids_titled("VLLM::Worker_TP") for title in watch.titles[pid]}
    assert {f"VLLM::Worker_TP{r}" for r in range(ROLLOUT_TP)} <= ranks, ranks


def test_nothing_listened_beyond_loopback_and_nothing_is_left(shape):
    assert_loopback_only_and_head_stopped(shape["watch"], shape["out"])
    watch = shape["watch"]
    left = {pid: titles for pid, titles in watch.titles.items() if is_alive_as(pid, titles)}
    assert left == {}, f"processes of the sweep still running: {left}"
