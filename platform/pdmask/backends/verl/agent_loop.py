"""``pdm_single_turn``: verl's single-turn agent loop, carrying mu's top-K to the trainer.

Selected with ``actor_rollout_ref.rollout.agent.default_agent_loop=pdm_single_turn`` (the dataset
must not name another loop in an ``agent_name`` column). It runs verl's ``SingleTurnAgentLoop``,
then turns the per-generated-token top-K the vLLM server put in ``extra_fields`` into the
full-sequence ``pdm_mu_topk_*`` fields of the data contract (``layout.py``) and stores them as
top-level sample fields, which verl's transfer queue keeps as nested ``(B, S, K+1)`` tensors.
Without a top-K from the server (``rollout.custom.pdm_topk`` unset) it is verl's loop unchanged.
"""

from __future__ import annotations

import logging

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from pdmask.backends.verl import compat
from pdmask.backends.verl.checks import AGENT_LOOP
from pdmask.backends.verl.layout import TOPK_IDS, TOPK_LOGPROBS, sequence_rows
from pdmask.backends.verl.vllm_shims import TOPK_IDS_FIELD, TOPK_LOGPROBS_FIELD

compat.require(["agent_loop"])
logger = logging.getLogger(__name__)


class PDMAgentLoopOutput(AgentLoopOutput):
    """verl's output whose ``as_dict`` lifts the top-K out of ``extra_fields`` (like teacher_ids)."""

    def as_dict(self):
        output = super().as_dict()
        extra = output.get("extra_fields", {})
        for key in (TOPK_IDS, TOPK_LOGPROBS):
            if key in extra:
                output[key] = extra.pop(key)
        return output


def with_topk(output: AgentLoopOutput) -> AgentLoopOutput:
    """The loop's output with mu's top-K in the contract layout (unchanged if the server sent none)."""
    extra = output.extra_fields
    if TOPK_IDS_FIELD not in extra:
        return output
    ids, lps, unusable = sequence_rows(
        len(output.prompt_ids),
        output.response_ids,
        output.response_logprobs,
        extra.pop(TOPK_IDS_FIELD),
        extra.pop(TOPK_LOGPROBS_FIELD),
    )
    if unusable:
        logger.warning(
            "%d of %d response tokens have no usable top-K (binary view)",
            unusable,
            len(output.response_ids),
        )
    extra[TOPK_IDS] = ids
    extra[TOPK_LOGPROBS] = lps
    fields = {name: getattr(output, name) for name in output.model_fields_set}
    fields["extra_fields"] = extra
    return PDMAgentLoopOutput(**fields)


@register(AGENT_LOOP)
class PDMSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params, **kwargs) -> AgentLoopOutput:
        return with_topk(await super().run(sampling_params, **kwargs))
