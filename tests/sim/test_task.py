"""The synthetic task: vocabulary, rule-based reward, held-out split, warm-start data, and
responses of variable length (attempts)."""

from __future__ import annotations

import torch

from pdmask.backends.sim.task import DEFAULT_TASK, EOS, EQUALS, FIRST_DIGIT_TOKEN, PAD


def test_vocabulary_is_wide_enough_for_a_real_top20_truncation():
    assert DEFAULT_TASK.vocab_size >= 1000
    probs = DEFAULT_TASK.synonym_probs()
    assert abs(float(probs.sum()) - 1) < 1e-6
    assert float(probs[:20].sum()) < 0.8  # even a sure digit leaves > 20% outside the top 20


def test_correct_demonstrations_score_one_in_any_surface_form():
    g = torch.Generator().manual_seed(0)
    a, b = DEFAULT_TASK.sample_train(64, g)
    responses = DEFAULT_TASK.demonstrations(a, b, g)
    assert responses.shape == (64, DEFAULT_TASK.response_len)
    assert torch.equal(DEFAULT_TASK.score(a, b, responses), torch.ones(64))
    assert len(set(responses[DEFAULT_TASK.is_digit(responses)].tolist())) > 30  # synonyms


def test_demonstrations_make_a_long_tailed_number_of_attempts_drafts_wrong_the_last_right():
    task = DEFAULT_TASK
    g = torch.Generator().manual_seed(4)
    a, b = task.sample_train(20_000, g)
    demos = task.demonstrations(a, b, g)
    lengths = (demos != PAD).sum(1)
    counts = torch.bincount(lengths, minlength=task.response_len + 1).double() / len(lengths)
    want = task.attempt_probs().double()  # P(r) ~ r^-2: 0.70, 0.18, 0.08, 0.04
    got = counts[task.attempt_len :: task.attempt_len]
    assert torch.allclose(got, want, atol=0.01), (got, want)
    assert float(want[0]) > 0.65 and float(want[-1]) > 0.03  # mostly short, a tail of 4x
    # every attempt but the last is a wrong draft closed by "="; the last is the answer
    answer = task.answer(a, b)
    for r in range(1, task.max_attempts + 1):
        rows = demos[lengths == r * task.attempt_len][:, : r * task.attempt_len]
        attempts = rows.view(rows.shape[0], r, task.attempt_len)
        assert (attempts[:, :-1, -1] == EQUALS).all() and (attempts[:, -1, -1] == EOS).all()
        digits = task.token_class(attempts[..., :-1])
        right = answer[lengths == r * task.attempt_len]
        assert (digits[:, -1] == right).all()
        assert (digits[:, :-1] != right[:, None]).any(-1).all()  # each draft wrong somewhere


def test_only_the_last_attempt_counts_and_only_a_well_formed_response_scores():
    task = DEFAULT_TASK
    a, b = torch.tensor([47, 47, 47, 47]), torch.tensor([58, 58, 58, 58])  # 105: 5, 0, 1

    def digits(*ds):
        return [FIRST_DIGIT_TOKEN + d for d in ds]

    rows = [
        digits(5, 0, 2) + [EQUALS] + digits(5, 0, 1) + [EOS],  # corrected: right
        digits(5, 0, 1) + [EQUALS] + digits(5, 0, 2) + [EOS],  # right, then wrong: wrong
        digits(5, 0, 1) + [EQUALS] + digits(5, 0) + [EOS, PAD],  # a short attempt: malformed
        digits(5, 0, 1) + [EQUALS] + digits(5, 0, 1) + [EQUALS],  # no <eos>: truncated
    ]
    responses = torch.tensor(rows)
    assert task.score(a, b, responses).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert task.final_attempt(responses)[0].nonzero().squeeze(1).tolist() == [4, 5, 6]


def test_wrong_digit_missing_eos_or_truncation_scores_zero():
    a, b = torch.tensor([47, 99]), torch.tensor([58, 1])  # 105 and 100
    good = torch.tensor([[5 + 5, 5 + 0, 5 + 1, EOS], [5 + 0, 5 + 0, 5 + 1, EOS]])
    assert DEFAULT_TASK.score(a, b, good).tolist() == [1.0, 1.0]
    wrong_digit = good.clone()
    wrong_digit[0, 1] = FIRST_DIGIT_TOKEN + 10 + 3  # a synonym of 3, not 0
    no_eos = good.clone()
    no_eos[:, -1] = PAD
    assert DEFAULT_TASK.score(a, b, wrong_digit).tolist() == [0.0, 1.0]
    assert DEFAULT_TASK.score(a, b, no_eos).tolist() == [0.0, 0.0]
    assert DEFAULT_TASK.score(a, b, good[:, :2]).tolist() == [0.0, 0.0]


def test_noisy_demonstrations_randomise_the_last_attempts_digits_at_the_given_rate():
    g = torch.Generator().manual_seed(1)
    a, b = DEFAULT_TASK.sample_train(2000, g)
    noisy = DEFAULT_TASK.demonstrations(a, b, g, noise=0.4)
    last = DEFAULT_TASK.token_class(noisy[DEFAULT_TASK.final_attempt(noisy)]).view(-1, 3)
    wrong = last != DEFAULT_TASK.answer(a, b)
    assert 0.3 < float(wrong.float().mean()) < 0.42  # 0.4 * 9/10 = 0.36 expected


def test_evaluation_problems_are_held_out_from_training():
    ea, eb = DEFAULT_TASK.eval_problems(50)
    held_out = set(zip(ea.tolist(), eb.tolist(), strict=True))
    assert len(held_out) == 50  # distinct problems
    g = torch.Generator().manual_seed(2)
    ta, tb = DEFAULT_TASK.sample_train(20_000, g)
    assert held_out.isdisjoint(zip(ta.tolist(), tb.tolist(), strict=True))
    again = DEFAULT_TASK.eval_problems(50)
    assert torch.equal(again[0], ea) and torch.equal(again[1], eb)


def test_likeliest_class_pools_synonyms():
    probs = torch.zeros(DEFAULT_TASK.vocab_size)
    sevens = FIRST_DIGIT_TOKEN + 10 * torch.arange(10) + 7
    probs[sevens] = 0.06  # 0.6 spread over ten synonyms of 7
    probs[FIRST_DIGIT_TOKEN + 3] = 0.4  # the single likeliest token is a 3
    assert int(DEFAULT_TASK.likeliest_class(probs)) == 7


def test_the_llm_like_regime_has_two_forms_per_digit_and_a_long_thin_filler_tail():
    from pdmask.backends.sim.task import TASKS

    task = TASKS["llm-like"]
    # Two forms per digit, and every digit form fits in the behaviour's top-20 view.
    assert task.vocab_size == 4096 and task.digit_tokens == 20
    assert task.vocab_size - task.first_filler == task.filler_tokens > 4000
    g = torch.Generator().manual_seed(0)
    a, b = task.sample_train(20_000, g)
    demos = task.demonstrations(a, b, g)
    fillers = demos >= task.first_filler  # ~120k response positions
    probs = task.filler_probs()  # Zipf: the most frequent filler is rare, the tail rarer still
    assert probs[0] < 0.2 and probs[-1] < probs[0] / 1000
    assert abs(float(fillers.float().sum() / (demos != PAD).sum()) - task.filler_rate) < 0.002
    assert torch.equal(task.score(a, b, demos), (~fillers).all(1).float())  # a filler is wrong
    assert set(task.token_class(demos[fillers]).tolist()) == {10}
    right = torch.cat([FIRST_DIGIT_TOKEN + task.answer(a[:1], b[:1]), torch.tensor([[EOS]])], 1)
    assert task.score(a[:1], b[:1], right).tolist() == [1.0]
