"""The base model of each stand-in: a short supervised warm start, cached and locked.

RL needs a policy that already solves the task sometimes (low but non-zero accuracy), as the
paper's base models do on AIME. A few hundred steps of next-token training on correct
demonstrations gives that. The result is deterministic and shared by every trial of a stand-in, so
it is cached in ``<cache_dir>/<stand-in>-<key>.pt`` (``key`` hashes everything that shapes it) and
built under an exclusive file lock: concurrent trials wait for the first one instead of repeating
its work.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from pdmask.backends.sim.checkpoint import atomic_torch_save
from pdmask.backends.sim.model import TinyDecoder
from pdmask.backends.sim.runtime import single_threaded
from pdmask.backends.sim.specs import STAND_INS, StandInSpec
from pdmask.backends.sim.task import DEFAULT_TASK, PAD, AdditionTask
from pdmask.errors import ConfigError
from pdmask.paths import model_cache_dir

log = logging.getLogger(__name__)

WARMSTART_VERSION = 3  # bump when the recipe below changes: old cache entries are then ignored
WARMSTART_SEED = 0
WARMUP_STEPS = 50  # linear learning-rate warmup of the clean phase
NOISY_LR_FRACTION = 0.3  # the noisy phase starts at this share of the peak rate, decays to 0
QUICK_STEPS = (24, 6)  # clean and noisy steps of a quick (smoke) warm start


def default_cache_dir() -> Path:
    return model_cache_dir() / "sim"


def new_model(spec: StandInSpec, task: AdditionTask = DEFAULT_TASK) -> TinyDecoder:
    """An untrained model of the stand-in's architecture for ``task``."""
    return TinyDecoder(
        vocab_size=task.vocab_size,
        max_len=task.seq_len,
        d_model=spec.d_model,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        d_ff=spec.d_ff,
        n_experts=spec.n_experts,
        experts_per_token=spec.experts_per_token,
    )


def _cache_key(spec: StandInSpec, task: AdditionTask, quick: bool) -> str:
    identity = {
        "version": WARMSTART_VERSION,
        "spec": spec.model_dump(),
        "task": task.__dict__,
        "quick": quick,
        "seed": WARMSTART_SEED,
        "torch": torch.__version__.split("+")[0],
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return digest[:12]


def prepare_base_model(
    stand_in: str,
    *,
    cache_dir: Path | str | None = None,
    quick: bool = False,
    task: AdditionTask = DEFAULT_TASK,
) -> Path:
    """Path of the stand-in's cached base model, training it first if no one has yet.

    ``quick``: a 30-step warm start instead of the stand-in's recipe (smoke runs).
    """
    if stand_in not in STAND_INS:
        raise ConfigError(f"unknown stand-in {stand_in!r}; known: {', '.join(STAND_INS)}")
    spec = STAND_INS[stand_in]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stand_in}-{_cache_key(spec, task, quick)}.pt"
    if path.exists():
        return path
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even on a crash
        if not path.exists():
            log.info("training the %s base model into %s", stand_in, path)
            with single_threaded():
                model, info = warm_start(spec, task, quick=quick)
            payload = {"state_dict": model.state_dict(), "stand_in": stand_in, **info}
            atomic_torch_save(payload, path)
    return path


def load_base_model(
    path: Path, spec: StandInSpec, task: AdditionTask = DEFAULT_TASK
) -> TinyDecoder:
    model = new_model(spec, task)
    model.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    return model


def warm_start(
    spec: StandInSpec, task: AdditionTask, *, quick: bool = False
) -> tuple[TinyDecoder, dict]:
    """Next-token training on demonstrations (loss on response tokens only), in two phases.

    1. Clean answers until the model has learned the task (teacher-forced, every digit's most
       likely class right on ``warmstart_target_acc`` of a batch's sequences, averaged over 20
       steps) or ``warmstart_max_steps``. Stopping on a criterion rather than a step count keeps
       the base models comparable across stand-ins and machines (learning the task is abrupt).
    2. ``warmstart_noisy_steps`` steps on answers whose digits are randomised with probability
       ``warmstart_noise``, at a decaying learning rate: the model stays right in its mode but
       becomes often wrong when sampled, as a base model is before RL.

    ``quick`` (smoke runs): 24 clean and 6 noisy steps; the model barely knows the task.
    """
    if quick:
        clean_cap, noisy_steps = QUICK_STEPS
    else:
        clean_cap, noisy_steps = spec.warmstart_max_steps, spec.warmstart_noisy_steps
    generator = torch.Generator().manual_seed(WARMSTART_SEED)
    with torch.random.fork_rng():
        torch.manual_seed(WARMSTART_SEED)
        model = new_model(spec, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.warmstart_lr, weight_decay=0.01)

    recent: list[float] = []
    clean_steps = 0
    for step in range(clean_cap):
        clean_steps = step + 1
        lr = spec.warmstart_lr * min(1.0, (step + 1) / WARMUP_STEPS)
        recent = (recent + [_train_step(model, optimizer, task, spec, generator, lr, 0.0)])[-20:]
        if len(recent) == 20 and sum(recent) / 20 >= spec.warmstart_target_acc:
            break
    for step in range(noisy_steps):
        lr = spec.warmstart_lr * NOISY_LR_FRACTION * (1 - step / noisy_steps)
        _train_step(model, optimizer, task, spec, generator, lr, spec.warmstart_noise)
    info = {"clean_steps": clean_steps, "noisy_steps": noisy_steps, "clean_acc": recent[-1:]}
    return model, info


def _train_step(model, optimizer, task, spec, generator, lr, noise) -> float:
    """One supervised step; returns the share of sequences whose last attempt's digits are each
    the most likely class (digit or other token, synonyms pooled) at their position."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    start = task.prompt_len - 1  # logits at this position predict the first response token
    a, b = task.sample_train(spec.warmstart_batch, generator)
    demos = task.demonstrations(a, b, generator, noise)
    seq = torch.cat([task.prompts(a, b), demos], dim=1)
    targets = seq[:, start + 1 :]
    logits = model(seq[:, :-1], logits_from=start)
    # the positions after a response's <eos> are padding: no target
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=PAD
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    with torch.no_grad():
        # graded on the last attempt's digits: drafts are wrong at random, not predictable
        graded = task.final_attempt(demos)
        right = task.likeliest_class(logits.softmax(-1)) == task.token_class(targets)
        return float((right | ~graded).all(-1).float().mean())
