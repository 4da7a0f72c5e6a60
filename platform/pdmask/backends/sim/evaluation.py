"""Held-out evaluation: avg@k (k samples per problem at temperature 1, mean accuracy).

Scored with the behaviour copy, i.e. the inference engine, as VeRL validates with its rollout
workers. Logged as ``val-core/synth/acc/mean_at_16`` (VeRL's ``mean@16`` after MLflow turns ``@``
into ``_at_``).
"""

from __future__ import annotations

import torch

from pdmask.backends.sim.model import TinyDecoder
from pdmask.backends.sim.rollout import sample_responses
from pdmask.backends.sim.task import AdditionTask
from pdmask.tracking.metric_names import HEADLINE_PATTERN

EVAL_METRIC = HEADLINE_PATTERN.replace("*", "synth")  # the synthetic task is its one dataset


@torch.no_grad()
def evaluate_avg_at_k(
    model: TinyDecoder,
    task: AdditionTask,
    *,
    problems: int,
    samples: int,
    generator: torch.Generator,
) -> float:
    """Mean accuracy over ``problems`` fixed held-out problems x ``samples`` samples each."""
    a, b = task.eval_problems(problems)
    a, b = a.repeat_interleave(samples), b.repeat_interleave(samples)
    responses = sample_responses(model, task.prompts(a, b), task.response_len, generator)
    return float(task.score(a, b, responses).mean())
