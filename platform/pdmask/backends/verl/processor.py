"""What pdmask computes from the policy's logits inside verl's FSDP forward (the logits hook).

verl 0.9.1's ``FSDPEngineWithLMHead.prepare_model_outputs`` calls the actor's loss function as
``loss_fn(student_logits=(1, N, V), data=micro_batch)`` when the micro-batch carries the flag
``distillation_use_topk`` (a hook added for top-K distillation; pdmask only borrows it). Each
returned ``(1, N)`` tensor comes back in ``model_output`` as a nested per-sample tensor, gathered
over Ulysses sequence parallelism. ``N`` is this rank's packed rows: row ``i`` holds the
(temperature-scaled) logits that predict packed token ``i+1``.

Three uses:

- training: the per-token trust-region statistics of the math API (``compute_token_stats``), read
  from the logits in row chunks without an ``[N, V]`` float32 copy; the entropy and the support's
  log-probs a recipe needs come out of the same pass with their gradients, which flow back through
  the engine's gather and nesting of hook outputs (differentiable, as for verl's own log-probs)
  into the model. The policy's entropy always comes out of that pass, as a value where no recipe
  differentiates it: verl logs none in bypass mode, and the figures read ``actor/entropy``;
- training with one of verl's own losses (``vanilla``): the entropy alone (:func:`entropy_outputs`);
- the old-policy pass (``pdm_mu_source=recompute``): pi_old's own top-K and sampled-token log-probs,
  which then play mu's part in the same data layout as the rollout's top-K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from verl.utils import tensordict_utils as tu
from verl.utils.ulysses import get_ulysses_sequence_parallel_world_size, slice_input_tensor

from pdmask.backends.verl.layout import OLD_ID_KEY, OLD_LP_KEY, packed_rows
from pdmask.trust_region import SENTINEL_THRESHOLD, TokenStats, compute_token_stats
from pdmask.trust_region.logits_pass import chunked_logits_pass, rows_per_chunk
from pdmask.trust_region.stats import ENTROPY, GRADIENT_INPUTS, SupportLogProbs

STAT_KEY = "pdm_stat_{}"
ENTROPY_KEY = STAT_KEY.format(ENTROPY)  # H(pi) per packed row, for every loss
SUPPORT_PREFIX = "support_view_"  # STAT_KEY names of the support view (support_view_<field>_<slot>)
PHASE_KEY = "pdm_phase"
OLD_PHASE = "old"


@dataclass(frozen=True)
class StatsSettings:
    """What the statistics pass needs to know about the method."""

    method: str
    topk: int
    chunk_size: int | None = None
    support: str = "union"
    inputs: tuple[str, ...] = ()  # the recipe's ``needs`` (those the pass computes: PASS_INPUTS)


def phase(data) -> str | None:
    """``"old"`` during the old-policy pass, else None."""
    return tu.get_non_tensor_data(data=data, key=PHASE_KEY, default=None)


def _local_rows(x: torch.Tensor) -> torch.Tensor:
    """This rank's share of packed rows, cut exactly as the engine cuts the logits (Ulysses SP)."""
    if get_ulysses_sequence_parallel_world_size() > 1:
        return slice_input_tensor(x.unsqueeze(0), dim=1).squeeze(0)
    return x


def _sampled_ids(data, device) -> torch.Tensor:
    """``y`` for every packed row: the next token, rolled over the *global* packed sequence."""
    return _local_rows(torch.roll(data["input_ids"].values(), shifts=-1, dims=0)).to(device)


def _check_rows(what: str, rows: int, logits: torch.Tensor) -> None:
    if rows != logits.shape[0]:
        raise ValueError(f"{what} has {rows} rows but the logits have {logits.shape[0]}")


def statistics_outputs(
    student_logits: torch.Tensor, data, settings: StatsSettings
) -> dict[str, torch.Tensor]:
    """The math API's per-token statistics for every packed row, as ``(1, N)`` tensors.

    No gradient, except for the differentiable inputs the recipe needs (``settings.inputs``): the
    policy gradient flows through verl's own ``log_probs``; the statistics only decide the mask
    and feed the diagnostics. The entropy is one of them whether or not the recipe needs it: the
    pass computes it in the sweep it makes anyway (``benchmarks/bench_loss.py``, paths
    ``hook-stats`` and ``hook-stats-entropy``, measures what it adds).
    """
    differentiable = set(settings.inputs) & set(GRADIENT_INPUTS)
    with torch.set_grad_enabled(torch.is_grad_enabled() and bool(differentiable)):
        return _statistics_outputs(student_logits, data, settings, differentiable)


def _statistics_outputs(student_logits, data, settings: StatsSettings, differentiable):
    logits = student_logits.squeeze(0)
    ids, lps = (_local_rows(t).to(logits.device) for t in packed_rows(data, settings.topk))
    sampled = _sampled_ids(data, logits.device)
    _check_rows("the top-K data", ids.shape[0], logits)
    return row_outputs(logits, sampled, ids, lps, settings, differentiable)


def row_outputs(
    logits, sampled, ids, lps, settings: StatsSettings, differentiable, shard=None
) -> dict[str, torch.Tensor]:
    """The statistics of rows already aligned with the logits ``[N, V]`` (``sampled [N]``, the
    top-K rows ``[N, K+1]``), as ``(1, N)`` outputs; ``shard``: the logits are this rank's
    vocabulary columns (``trust_region.vocab_parallel``, verl's Megatron engine)."""
    k = settings.topk
    mu_sampled = lps[:, k]
    # Rows that predict no response token (prompt rows, a sequence's last row) carry no behaviour
    # log-prob; any finite value keeps their (discarded) statistics finite.
    mu_sampled = torch.where(
        mu_sampled > SENTINEL_THRESHOLD, mu_sampled, torch.zeros_like(mu_sampled)
    )
    # Binary methods' masks ignore the top-K, but their diagnostics (top-K KL, disagreements) use it.
    with torch.autocast(device_type=logits.device.type, enabled=False):
        stats = compute_token_stats(
            logits,
            sampled,
            ids[:, :k],
            lps[:, :k],
            mu_sampled,
            chunk_size=settings.chunk_size,
            support=settings.support,
            inputs=(*settings.inputs, ENTROPY),  # (second_order too: detached statistics)
            shard=shard,
        )
    out = {
        STAT_KEY.format(name): (t if name in differentiable else t.detach()).unsqueeze(0)
        for name, t in stats.tensors().items()
    }
    out[STAT_KEY.format("vocab_size")] = torch.full_like(mu_sampled, stats.vocab_size).unsqueeze(0)
    if stats.support is not None:
        out.update(_support_outputs(stats.support))
    return out


@torch.no_grad()
def entropy_outputs(
    student_logits: torch.Tensor, data, chunk_size: int | None = None
) -> dict[str, torch.Tensor]:
    """H(pi) for every packed row as one ``(1, N)`` output (no gradient): what the hook computes
    for a loss that is verl's own, in the same logits pass (support: the sampled token only)."""
    logits = student_logits.squeeze(0)
    sampled = _sampled_ids(data, logits.device)
    _check_rows("input_ids", sampled.shape[0], logits)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        lp = chunked_logits_pass(
            logits, sampled, sampled[:, None], chunk_size=chunk_size, entropy=True
        )
    return {ENTROPY_KEY: lp.entropy.unsqueeze(0)}


def _support_outputs(support: SupportLogProbs) -> dict[str, torch.Tensor]:
    """The support view as ``(1, N)`` outputs, one per slot and field (the engine takes 1-D
    per-token outputs only): ids and the valid flag as exact floats (ids < 2**24), log-probs
    finite on invalid slots (0; ``-inf`` is put back from the flag after the padding)."""
    out = {}
    valid = support.valid
    slots = {
        "ids": support.ids.to(torch.float32),
        "valid": valid.to(torch.float32),
        "log_prob": torch.where(valid, support.log_prob, 0.0),
        "mu_log_prob": torch.where(valid, support.mu_log_prob, 0.0),
    }
    for name, values in slots.items():
        for slot in range(values.shape[-1]):
            out[STAT_KEY.format(f"{SUPPORT_PREFIX}{name}_{slot}")] = values[:, slot].unsqueeze(0)
    for name in ("tail_mass", "mu_tail_mass"):
        out[STAT_KEY.format(f"{SUPPORT_PREFIX}{name}")] = getattr(support, name).unsqueeze(0)
    return out


def _support_from_outputs(fields: dict[str, torch.Tensor]) -> SupportLogProbs | None:
    """Pop the support outputs (already in the ``(B, R)`` frame) back into ``[B, R, M]`` form."""
    mine = sorted(k for k in fields if k.startswith(SUPPORT_PREFIX))
    if not mine:
        return None
    parts = {k[len(SUPPORT_PREFIX) :]: fields.pop(k) for k in mine}

    def stacked(name: str) -> torch.Tensor:
        slots = sorted(
            (int(k.rsplit("_", 1)[1]), v)
            for k, v in parts.items()
            if k.startswith(name + "_") and k[len(name) + 1 :].isdigit()
        )
        return torch.stack([v for _, v in slots], dim=-1)

    valid = stacked("valid") > 0.5
    return SupportLogProbs(
        ids=stacked("ids").round().long(),
        valid=valid,
        log_prob=torch.where(valid, stacked("log_prob"), -torch.inf),
        mu_log_prob=torch.where(valid, stacked("mu_log_prob"), -torch.inf),
        tail_mass=parts["tail_mass"],
        mu_tail_mass=parts["mu_tail_mass"],
    )


def stats_from_outputs(padded: dict[str, torch.Tensor]) -> TokenStats:
    """Rebuild a ``TokenStats`` from statistics already put in the loss's ``(B, R)`` frame."""
    fields = {name[len(STAT_KEY.format("")) :]: t for name, t in padded.items()}
    vocab = fields.pop("vocab_size")
    support = _support_from_outputs(fields)
    return TokenStats(
        **fields, vocab_size=int(vocab.max().item()) if vocab.numel() else 0, support=support
    )


@torch.no_grad()
def old_policy_topk_outputs(
    student_logits: torch.Tensor, data, k: int, chunk_size: int | None = None
) -> dict[str, torch.Tensor]:
    """pi_old's top-K and sampled-token log-probs per packed row, one ``(1, N)`` tensor per slot.

    The engine hook only accepts 1-D per-token outputs, hence ``2(K+1)`` of them; the worker
    stacks them back into the ``(S, K+1)`` layout (``layout.stack_old_slots``).
    """
    logits = student_logits.squeeze(0)
    n, vocab = logits.shape
    sampled = _sampled_ids(data, logits.device)
    _check_rows("input_ids", sampled.shape[0], logits)
    rows = rows_per_chunk(vocab, chunk_size, logits.device)  # the math API's chunks
    top_ids = torch.empty(n, k, dtype=torch.long, device=logits.device)
    top_lps = torch.empty(n, k, dtype=torch.float32, device=logits.device)
    sampled_lps = torch.empty(n, dtype=torch.float32, device=logits.device)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            z = logits[start:stop].float()
            log_z = torch.logsumexp(z, dim=-1, keepdim=True)
            values, indices = z.topk(k, dim=-1)
            top_ids[start:stop] = indices
            top_lps[start:stop] = values - log_z
            sampled_lps[start:stop] = z.gather(1, sampled[start:stop, None]).squeeze(
                1
            ) - log_z.squeeze(1)
    out = {}
    for i in range(k):
        out[OLD_ID_KEY.format(i)] = top_ids[:, i].unsqueeze(0)
        out[OLD_LP_KEY.format(i)] = top_lps[:, i].unsqueeze(0)
    out[OLD_ID_KEY.format(k)] = sampled.unsqueeze(0)
    out[OLD_LP_KEY.format(k)] = sampled_lps.unsqueeze(0)
    return out
