"""Speculative decoding is lossless: greedy equals AR greedy token for token in fp32, and
sampling follows the target's distribution exactly (a wrong acceptance rule is caught)."""

import copy

import pytest
import torch

from specdec_lab.decoders import autoregressive, speculative
from specdec_lab.decoders.candidates import DraftLength, DraftModelCandidates, PromptLookupCandidates
from specdec_lab.models import check_same_tokenizer
from specdec_lab.sampling import Sampling, probabilities
from tiny import PROMPT, tiny_llama

TARGET = tiny_llama(seed=0)
DRAFT = tiny_llama(seed=1, layers=1)


def ar(max_new_tokens, stop_ids=()):
    return autoregressive.generate(TARGET, PROMPT, max_new_tokens, stop_ids=stop_ids).tokens


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_equals_ar_with_an_unrelated_draft(k):
    result = speculative.generate(TARGET, DraftModelCandidates(DRAFT, k), PROMPT, 48, stop_ids=[])
    assert result.tokens == ar(48)
    assert result.draft_forwards > 0


def test_target_drafting_for_itself_accepts_everything():
    result = speculative.generate(TARGET, DraftModelCandidates(TARGET, 4), PROMPT, 41, stop_ids=[])
    assert result.tokens == ar(41)
    assert result.accepted_per_step == [4] * 8  # 1 token from the prefill + 8 steps of 4 + 1
    assert result.target_forwards == 9


@pytest.mark.parametrize("schedule, threshold", [("heuristic", 0.0), ("constant", 0.3), ("heuristic", 0.5)])
def test_adaptive_draft_length_stays_lossless(schedule, threshold):
    candidates = DraftModelCandidates(DRAFT, 3, schedule, threshold)
    assert speculative.generate(TARGET, candidates, PROMPT, 48, stop_ids=[]).tokens == ar(48)


def test_heuristic_schedule_grows_and_shrinks():
    length = DraftLength(3, "heuristic")
    length.update(3, 3)
    assert length.k == 5
    length.update(0, 5)
    assert length.k == 4
    length.reset()
    assert length.k == 3


def test_prompt_lookup_is_lossless_and_finds_repeats():
    repetitive = PROMPT + PROMPT + PROMPT
    expected = autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
    result = speculative.generate(TARGET, PromptLookupCandidates(5), repetitive, 40, stop_ids=[])
    assert result.tokens == expected and result.draft_forwards == 0


def test_eos_inside_an_accepted_block():
    free = ar(40)
    stop = free[6]
    expected = free[: free.index(stop) + 1]
    result = speculative.generate(TARGET, DraftModelCandidates(TARGET, 8), PROMPT, 40, stop_ids=[stop])
    assert result.tokens == expected


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7, 11])
def test_max_new_tokens_inside_a_block_and_k_larger_than_what_is_left(max_new_tokens):
    result = speculative.generate(TARGET, DraftModelCandidates(TARGET, 5), PROMPT, max_new_tokens, stop_ids=[])
    assert result.tokens == ar(max_new_tokens)


def test_state_does_not_leak_between_prompts():
    candidates = DraftModelCandidates(DRAFT, 3, "heuristic")
    first = speculative.generate(TARGET, candidates, PROMPT, 30, stop_ids=[])
    other = speculative.generate(TARGET, candidates, [1, 40, 41, 42], 30, stop_ids=[])
    again = speculative.generate(TARGET, candidates, PROMPT, 30, stop_ids=[])
    assert again.tokens == first.tokens and again.accepted_per_step == first.accepted_per_step
    assert other.tokens == autoregressive.generate(TARGET, [1, 40, 41, 42], 30, stop_ids=[]).tokens


def test_draft_with_a_padded_embedding_matrix():
    padded_draft = tiny_llama(seed=2, vocab_size=128, layers=1)  # same token space, head padded to 128
    for sampling in (Sampling(), Sampling(temperature=1.0, seed=3)):
        result = speculative.generate(TARGET, DraftModelCandidates(padded_draft, 4), PROMPT, 30, sampling, stop_ids=[])
        assert len(result.tokens) == 30 and max(result.tokens) < 97
    greedy = speculative.generate(TARGET, DraftModelCandidates(padded_draft, 4), PROMPT, 30, stop_ids=[])
    assert greedy.tokens == ar(30)


class _Vocab:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_different_tokenizers_are_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="different vocabularies.*same tokenizer"):
        check_same_tokenizer(_Vocab({"a": 0, "b": 1}), _Vocab({"a": 0, "c": 1}), "big", "small")
    check_same_tokenizer(_Vocab({"a": 0}), _Vocab({"a": 0}))


def test_k_below_one_is_refused():
    with pytest.raises(ValueError, match="k must be >= 1"):
        DraftModelCandidates(DRAFT, 0)


# --- sampling is exact in distribution -------------------------------------------------------

SMALL_VOCAB = 6
SMALL_TARGET = tiny_llama(seed=10, vocab_size=SMALL_VOCAB, layers=1, hidden=16, head_std=0.3)
# The draft is the target made over-confident (head x4): it proposes the target's likely tokens
# more often than the target would pick them, so a wrong rejection rule shows up clearly.
SMALL_DRAFT = copy.deepcopy(SMALL_TARGET)
with torch.no_grad():
    SMALL_DRAFT.lm_head.weight.mul_(4.0)
SMALL_PROMPT = [1, 2, 4]
SAMPLES = 1000


@torch.inference_mode()
def exact_marginals(model, prompt, steps, sampling):
    """Exact P(token at position t) for t < steps, by enumerating every prefix (vocab 6)."""
    paths = {(): 1.0}
    marginals = []
    for _ in range(steps):
        nxt, marginal = {}, torch.zeros(SMALL_VOCAB)
        for path, mass in paths.items():
            logits = model(torch.tensor([prompt + list(path)])).logits[0, -1]
            p = probabilities(logits, sampling)
            marginal += mass * p
            for token in range(SMALL_VOCAB):
                nxt[path + (token,)] = mass * float(p[token])
        paths, marginals = nxt, marginals + [marginal]
    return marginals


def empirical_marginals(steps, sampling):
    counts = torch.zeros(steps, SMALL_VOCAB)
    candidates = DraftModelCandidates(SMALL_DRAFT, 2)
    for seed in range(SAMPLES):
        seeded = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed=seed)
        tokens = speculative.generate(SMALL_TARGET, candidates, SMALL_PROMPT, steps, seeded, stop_ids=[]).tokens
        for position, token in enumerate(tokens):
            counts[position, token] += 1
    return counts / SAMPLES


def total_variation(p, q):
    return 0.5 * float((p - q).abs().sum())


def _worst_tv(sampling, steps=3):
    exact = exact_marginals(SMALL_TARGET, SMALL_PROMPT, steps, sampling)
    empirical = empirical_marginals(steps, sampling)
    return max(total_variation(exact[t], empirical[t]) for t in range(1, steps))


# 1000 seeded samples over 6 tokens: a correct sampler lands near TV 0.02 (sampling noise),
# the wrong rule below near 0.12; the runs are seeded, so the outcome is reproducible.
TV_LIMIT = 0.06


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=4, top_p=0.9)])
def test_speculative_sampling_matches_the_target_distribution(sampling):
    assert _worst_tv(sampling) < TV_LIMIT


def test_a_wrong_rejection_rule_fails_the_same_check(monkeypatch):
    """The classic bug: on rejection, resample from p instead of norm(max(0, p - q))."""
    def resample_from_p(target_logits, candidates, sampling, rng):
        p = probabilities(target_logits, sampling)
        q = candidates.probs
        for i, x in enumerate(candidates.token_ids):
            if torch.rand((), generator=rng) >= torch.clamp(p[i, x] / q[i, x], max=1.0):
                return i, int(torch.multinomial(p[i], 1, generator=rng))
        return len(candidates.token_ids), int(torch.multinomial(p[-1], 1, generator=rng))

    monkeypatch.setattr(speculative, "accept_sampled", resample_from_p)
    worst = _worst_tv(Sampling(temperature=1.0))
    assert worst > TV_LIMIT, worst
