"""The verifiable synthetic task: two-digit addition, answered in a variable number of attempts,
in two token regimes.

Prompt ``<bos> a1 a2 + b1 b2 =`` (``n_digits`` = 2 by default; canonical digit tokens). The
response is one or more **attempts**, each the ``n+1`` digits of a candidate sum (least
significant first, so carries flow in writing order): every attempt but the last ends with ``=``
(a re-check: "no, ="), the last with ``<eos>``. The reward is rule-based: 1 when the response is
well formed (attempts of ``n+1`` digit tokens, ``=`` between them, ``<eos>`` within
``max_attempts``) and its **last** attempt is ``a + b``, else 0.

Why attempts: responses of real length. Every response used to be 4 tokens, so a sequence-level
or length-dependent method (GSPO, a per-response threshold, Dr. GRPO's aggregation) behaved like a
token-level one with another constant (issue 46). Demonstrations make ``r`` attempts with
``P(r) ~ r^-attempt_zipf`` up to ``max_attempts`` (the defaults: 1, 2, 3 or 4 attempts with
probabilities 0.70, 0.18, 0.08, 0.04, so 4, 8, 12 or 16 tokens: a long tail at 4 times the
mode, the shape of reasoning models' lengths), and each attempt before the last is a *draft*
that is wrong (one digit always, the others with probability ``draft_noise``): the demonstrated
policy checks its attempt and tries again when it is wrong. A base model learns that shape; RL
then moves lengths and correctness together (longer responses are the ones that erred first), as
it does at scale. A response that is still re-checking at ``max_attempts`` is truncated (reward
0), like an overlong one.

The regimes (``TASKS``) differ only in how the answer's tokens are spread over the vocabulary:

- ``synonyms`` (the default): a real tokenizer has many tokens for one meaning (``5``, `` 5``,
  ``five``), so every digit has ``synonyms_per_digit`` = 102 interchangeable tokens (token ``t``
  means digit ``(t - first) % 10``), picked Zipf-distributed by the demonstrations. Logits are
  1,025 wide and the behaviour's top-20 view holds about half the mass: the near-duplicate output
  embeddings spread every update over ~100 tokens and make the tail term of ``Ddot`` large.
- ``llm-like``: two surface forms per digit (``5`` and `` 5``, Zipf: 2/3 and 1/3) and a
  vocabulary of 4,096 whose other 4,071 tokens are *fillers*, meaningless tokens that
  demonstrations emit with probability ``filler_rate`` per response position, Zipf-distributed
  over the fillers. The next-token distribution is then an LLM's shape: a few plausible tokens
  (every digit form fits in the top 20, so the top-20 view holds > 99 % of the mass) and a long
  thin tail over thousands of tokens, none a near-duplicate of another. The second surface form
  is what makes the direction tests disagree at all (with one token per digit the sampled token
  nearly always carries most of the mass, the global term of ``Ddot`` follows the local one). A
  filler in the response makes it wrong.

Held-out split: a problem ``(a, b)`` belongs to the evaluation pool when a fixed hash puts it there
(about 1 in 61, some 160 problems for two digits); training never samples those problems.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
FIRST_DIGIT_TOKEN = 5
EVAL_SPLIT_MODULUS = 61  # one problem in 61 is held out for evaluation


@dataclass(frozen=True)
class AdditionTask:
    """Addition of two ``n_digits`` numbers; see the module docstring."""

    n_digits: int = 2
    synonyms_per_digit: int = 102
    synonym_zipf: float = 1.0
    filler_tokens: int = 0  # meaningless tokens after the digit tokens (the llm-like tail)
    filler_rate: float = 0.0  # probability that a demonstrated response token is a filler
    filler_zipf: float = 1.0  # Zipf exponent of the fillers' frequencies
    max_attempts: int = 4  # the most attempts a response may make (its length cap)
    attempt_zipf: float = 2.0  # demonstrations make r attempts with P(r) ~ r^-attempt_zipf
    draft_noise: float = 0.5  # a draft's digits beyond its one wrong digit: random with this

    @property
    def digit_tokens(self) -> int:
        return 10 * self.synonyms_per_digit

    @property
    def first_filler(self) -> int:
        return FIRST_DIGIT_TOKEN + self.digit_tokens

    @property
    def vocab_size(self) -> int:
        return self.first_filler + self.filler_tokens

    @property
    def prompt_len(self) -> int:
        return 2 * self.n_digits + 3

    @property
    def answer_digits(self) -> int:
        return self.n_digits + 1

    @property
    def attempt_len(self) -> int:
        """An attempt's tokens: the answer's digits and ``=`` (a re-check) or ``<eos>``."""
        return self.answer_digits + 1

    @property
    def response_len(self) -> int:
        """``max_attempts`` attempts: the longest a response may be (and a correct one is)."""
        return self.attempt_len * self.max_attempts

    def attempt_probs(self) -> torch.Tensor:
        """``P(r)`` for ``r = 1 .. max_attempts`` attempts in a demonstration."""
        return _zipf(self.max_attempts, self.attempt_zipf)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    # ---- problems -----------------------------------------------------------------------------
    def _is_eval(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * 7919 + b * 104729) % EVAL_SPLIT_MODULUS == 0

    def sample_train(
        self, count: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` training problems ``(a, b)``, never from the held-out pool."""
        high = 10**self.n_digits
        out_a, out_b, have = [], [], 0
        while have < count:
            a = torch.randint(0, high, (2 * count,), generator=generator)
            b = torch.randint(0, high, (2 * count,), generator=generator)
            keep = ~self._is_eval(a, b)
            out_a.append(a[keep])
            out_b.append(b[keep])
            have += int(keep.sum())
        return torch.cat(out_a)[:count], torch.cat(out_b)[:count]

    def eval_pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every held-out problem, in a fixed shuffled order."""
        high = 10**self.n_digits
        a = torch.arange(high).repeat_interleave(high)
        b = torch.arange(high).repeat(high)
        keep = self._is_eval(a, b)
        order = torch.randperm(int(keep.sum()), generator=torch.Generator().manual_seed(10_007))
        return a[keep][order], b[keep][order]

    def eval_problems(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``count`` distinct held-out problems (the same for every trial)."""
        a, b = self.eval_pool()
        if count > a.shape[0]:
            raise ValueError(f"only {a.shape[0]} held-out problems exist, {count} requested")
        return a[:count], b[:count]

    # ---- encoding -----------------------------------------------------------------------------
    def _digits(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """Digits of ``x`` most significant first, ``[..., width]``."""
        powers = 10 ** torch.arange(width - 1, -1, -1)
        return (x.unsqueeze(-1) // powers) % 10

    def prompts(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = a.shape[0]
        parts = [
            torch.full((n, 1), BOS),
            FIRST_DIGIT_TOKEN + self._digits(a, self.n_digits),
            torch.full((n, 1), PLUS),
            FIRST_DIGIT_TOKEN + self._digits(b, self.n_digits),
            torch.full((n, 1), EQUALS),
        ]
        return torch.cat(parts, dim=1)

    def answer(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The target digits in writing order (least significant first), ``[n, n_digits + 1]``."""
        return self._digits(a + b, self.answer_digits).flip(-1)

    def synonym_probs(self) -> torch.Tensor:
        return _zipf(self.synonyms_per_digit, self.synonym_zipf)

    def filler_probs(self) -> torch.Tensor:
        return _zipf(self.filler_tokens, self.filler_zipf)

    def demonstrations(
        self, a: torch.Tensor, b: torch.Tensor, generator: torch.Generator, noise: float = 0.0
    ) -> torch.Tensor:
        """Warm-start responses, ``[n, response_len]`` (``<pad>`` after ``<eos>``): ``r`` attempts
        (``attempt_probs``), each draft wrong, the last one the answer with each digit replaced by
        a uniformly random one with probability ``noise`` (imperfect data, so a model that
        imitates it is right in its mode but often wrong when sampled), in Zipf-sampled surface
        forms. With fillers, every response token (``=`` and ``<eos>`` included) is a Zipf-drawn
        filler with probability ``filler_rate``: the rare, meaningless continuations that make an
        LLM's long tail."""
        n, width, tries = a.shape[0], self.answer_digits, self.max_attempts
        answer = self.answer(a, b)[:, None, :].expand(n, tries, width)
        # drafts: one digit surely wrong, the others random with probability draft_noise
        wrong_at = torch.randint(0, width, (n, tries, 1), generator=generator)
        shift = torch.randint(1, 10, (n, tries, 1), generator=generator)
        forced = torch.arange(width) == wrong_at
        drafts = torch.where(forced, (answer + shift) % 10, answer)
        noisy = torch.rand(drafts.shape, generator=generator) < self.draft_noise
        drafts = torch.where(
            noisy & ~forced, torch.randint(0, 10, drafts.shape, generator=generator), drafts
        )
        final = answer[:, 0]
        replaced = torch.rand(final.shape, generator=generator) < noise
        final = torch.where(replaced, torch.randint(0, 10, final.shape, generator=generator), final)
        attempts = 1 + torch.multinomial(
            self.attempt_probs(), n, replacement=True, generator=generator
        )
        index = torch.arange(tries)[None, :]
        last = index == (attempts - 1)[:, None]  # [n, tries]
        digits = torch.where(last[..., None], final[:, None, :], drafts)
        ranks = torch.multinomial(
            self.synonym_probs(), digits.numel(), replacement=True, generator=generator
        ).view_as(digits)
        ends = torch.where(last, EOS, EQUALS)[..., None]
        tokens = torch.cat([FIRST_DIGIT_TOKEN + ranks * 10 + digits, ends], dim=-1)
        used = (index < attempts[:, None])[..., None]
        tokens = torch.where(used, tokens, PAD).reshape(n, self.response_len)
        if self.filler_tokens and self.filler_rate > 0:
            is_filler = torch.rand(tokens.shape, generator=generator) < self.filler_rate
            fillers = self.first_filler + torch.multinomial(
                self.filler_probs(), tokens.numel(), replacement=True, generator=generator
            ).view_as(tokens)
            tokens = torch.where(is_filler & (tokens != PAD), fillers, tokens)
        return tokens

    def final_attempt(self, responses: torch.Tensor) -> torch.Tensor:
        """``[n, R]`` bool: the digit positions of each response's last attempt (the ``n+1``
        tokens before its first ``<eos>``; none without one)."""
        eos = responses == EOS
        end = torch.where(eos.any(1), eos.int().argmax(1), -1)
        position = torch.arange(responses.shape[1])[None, :]
        return (position < end[:, None]) & (position >= (end - self.answer_digits)[:, None])

    def is_digit(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens >= FIRST_DIGIT_TOKEN) & (tokens < self.first_filler)

    def token_class(self, tokens: torch.Tensor) -> torch.Tensor:
        """Meaning of tokens, synonyms pooled: the digit 0..9, or 10 for any other token."""
        return torch.where(self.is_digit(tokens), (tokens - FIRST_DIGIT_TOKEN) % 10, 10)

    def likeliest_class(self, probs: torch.Tensor) -> torch.Tensor:
        """The most likely class (as :meth:`token_class`) of distributions ``probs [..., V]``."""
        digit_probs = probs[..., FIRST_DIGIT_TOKEN : self.first_filler]
        digits = digit_probs.unflatten(-1, (self.synonyms_per_digit, 10)).sum(-2)
        other = probs[..., :FIRST_DIGIT_TOKEN].sum(-1, keepdim=True)
        other = other + probs[..., self.first_filler :].sum(-1, keepdim=True)
        return torch.cat([digits, other], dim=-1).argmax(-1)

    # ---- reward -------------------------------------------------------------------------------
    def score(self, a: torch.Tensor, b: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """1.0 where the response is well formed (attempts of ``n+1`` digit tokens, ``=`` between
        them, ``<eos>`` after the last) and its last attempt is the answer's digits, else 0.0."""
        n, width = responses.shape[0], self.answer_digits
        eos = responses == EOS
        length = torch.where(eos.any(1), eos.int().argmax(1) + 1, 0)  # through the first <eos>
        position = torch.arange(responses.shape[1])[None, :]
        inside = position < (length - 1)[:, None]  # the attempts, without the closing <eos>
        separator = (position % self.attempt_len) == width
        shaped = torch.where(
            separator, responses == EQUALS, self.is_digit(responses)
        )  # a separator where one belongs, a digit everywhere else
        well_formed = (length > 0) & (length % self.attempt_len == 0) & (shaped | ~inside).all(1)
        if responses.shape[1] <= width:  # too short for any attempt and its <eos>
            return torch.zeros(n)
        start = (length - 1 - width).clamp_min(0)
        at = (start[:, None] + torch.arange(width)[None, :]).clamp_max(responses.shape[1] - 1)
        last = responses.gather(1, at)
        right = ((last - FIRST_DIGIT_TOKEN) % 10 == self.answer(a, b)).all(1)
        return (well_formed & right).float().reshape(n)


def _zipf(count: int, exponent: float) -> torch.Tensor:
    ranks = torch.arange(1, count + 1, dtype=torch.float64)
    weights = ranks.pow(-exponent)
    return (weights / weights.sum()).float()


TASKS: dict[str, AdditionTask] = {
    "synonyms": AdditionTask(),
    # 4,096 logits: a vocabulary 4x the synonyms regime's, of which 4,071 fillers. A filler rate
    # of 1 % per position with a Zipf(1.1) spread leaves a thin tail over every filler.
    "llm-like": AdditionTask(
        synonyms_per_digit=2, filler_tokens=4071, filler_rate=0.01, filler_zipf=1.1
    ),
}
"""The task regimes (``SimTrialConfig.task``); see the module docstring."""
DEFAULT_TASK = TASKS["synonyms"]
"""The regime a trial uses unless its config names another."""
