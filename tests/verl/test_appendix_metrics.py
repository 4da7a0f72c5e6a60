"""Every metric the paper's appendix dashboard names is one a VeRL job logs, by verl 0.9.1's own
names: produced here by verl's own metric code (its data metrics, its validation naming) and by
the loss path every job's actor runs (pdmask's losses and verl's own)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.metric_utils import compute_data_metrics  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from pdmask.backends.verl.jobs import eval_metrics, setup_for  # noqa: E402
from pdmask.backends.verl.rewards import compute_score  # noqa: E402
from pdmask.figures import load_spec  # noqa: E402
from pdmask.tracking.metric_names import match_datasets, sanitize_metric  # noqa: E402

from .batches import make_batch  # noqa: E402
from .test_loss_path import ALL, actor_config, verl_step  # noqa: E402


def data_metrics() -> set[str]:
    """verl's compute_data_metrics on a small batch shaped as its v1 trainer builds it."""
    n, prompt, response = 4, 3, 5
    mask = torch.ones(n, response)
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": torch.rand(n, response),
            "token_level_rewards": torch.rand(n, response),
            "advantages": torch.randn(n, response),
            "returns": torch.randn(n, response),
            "prompts": torch.zeros(n, prompt, dtype=torch.long),
            "responses": torch.zeros(n, response, dtype=torch.long),
            "response_mask": mask,
            "prompt_length": torch.full((n,), float(prompt)),
            "response_length": mask.sum(-1),
        },
        non_tensors={"__num_turns__": np.full(n, 2, dtype=np.int32)},
    )
    return set(compute_data_metrics(batch, use_critic=False))


def validation_metrics() -> set[str]:
    """verl's validation metric names (its trainer's own naming) for the jobs' data sources and
    samples per problem, with pdmask's reward's extra infos."""
    from pdmask.backends.verl.trainer import PDMTrainerSync

    n = setup_for("h20x32").val_samples
    sources = [source for source in ("aime24", "aime25") for _ in range(2 * n)]
    uids = [f"{source}-{i // n}" for i, source in enumerate(sources)]
    scores = [compute_score(source, "Answer: 7", "7") for source in sources]
    infos = {key: [s[key] for s in scores] for key in ("score", "acc")}
    trainer = PDMTrainerSync.__new__(PDMTrainerSync)  # _val_metrics_update reads only its args
    return set(trainer._val_metrics_update(sources, uids, infos, []))


def actor_metrics(carry) -> tuple[set[str], set[str]]:
    """The metrics of the actor's loss, for a pdmask loss and for verl's own (vanilla)."""
    _, ours = verl_step(make_batch(), ALL, actor_config(carry("pdm-agg", delta=0.05).loss_mode))
    vanilla = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    _, verls = verl_step(make_batch(), ALL, vanilla)
    return set(ours), set(verls)


def test_every_appendix_metric_is_one_verl_logs(carry):
    spec = load_spec("paper-appendix")
    validation = validation_metrics()
    stored = {sanitize_metric(name) for name in validation}
    assert set(eval_metrics("h20x32")) <= stored  # what pdmask says the jobs log, verl agrees
    training = data_metrics()
    pdmask_loss, verl_loss = actor_metrics(carry)
    for metric in spec.diagnostics.metrics:
        name = metric.name
        if name.startswith("val-core/"):
            assert name in validation, name
        elif name.startswith("actor/"):
            assert name in pdmask_loss and name in verl_loss, name  # every method's jobs
        else:
            assert name in training, name
    # the main figure's pattern finds both datasets among verl's validation metrics
    assert set(match_datasets(spec.metric.pattern, stored)) == {"aime24", "aime25"}
    # what the appendix asks for, by the paper's words
    names = {m.name for m in spec.diagnostics.metrics}
    assert names == {
        "val-core/aime24/acc/mean@16",
        "val-core/aime25/acc/mean@16",
        "critic/score/mean",
        "response_length/mean",
        "actor/ppo_kl",
        "actor/pg_clipfrac",
    }
