"""Which tokens survive temperature, top-k and top-p, checked at their boundaries and against
transformers' own warpers (`TopKLogitsWarper`, `TopPLogitsWarper`), whose semantics the kit follows.
Each test names the plausible bug it catches."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdec_lab.sampling import Sampling, greedy_tokens, next_token, probabilities, sample


def kept(logits, sampling: Sampling) -> list[int]:
    """The token ids with mass after the filters."""
    return torch.nonzero(probabilities(torch.as_tensor(logits, dtype=torch.float32), sampling) > 0)[:, 0].tolist()


def transformers_probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """transformers' chain for sampling in generate: temperature, then top-k, then top-p."""
    scores = TemperatureLogitsWarper(sampling.temperature)(None, logits[None].float().clone())
    if sampling.top_k:
        scores = TopKLogitsWarper(sampling.top_k)(None, scores)
    if sampling.top_p < 1.0:
        scores = TopPLogitsWarper(sampling.top_p)(None, scores)
    return scores.softmax(-1)[0]


def test_greedy_is_one_hot_on_the_first_argmax():
    """Catches a tie in the argmax broken towards the later token (greedy decoding would then differ
    from torch's argmax, which every decoder uses)."""
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0])
    assert probabilities(logits, Sampling()).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert next_token(logits, Sampling(), None) == 1


def test_temperature_divides_the_logits():
    """Catches temperature applied as a multiplier or after the softmax."""
    logits = torch.tensor([2.0, 1.0, 0.0])
    assert torch.allclose(probabilities(logits, Sampling(temperature=0.5)), (logits / 0.5).softmax(-1))


def test_top_k_keeps_the_k_largest_and_every_tie_at_the_kth():
    """Catches a filter that drops the tokens tied with the k-th largest logit (`<=` for `<`) or
    keeps k + 1 tokens; transformers' TopKLogitsWarper keeps ties too."""
    assert kept([4.0, 3.0, 2.0, 1.0], Sampling(temperature=1.0, top_k=2)) == [0, 1]
    assert kept([4.0, 3.0, 3.0, 1.0], Sampling(temperature=1.0, top_k=2)) == [0, 1, 2]  # a tie at the 2nd
    assert kept([4.0, 3.0], Sampling(temperature=1.0, top_k=5)) == [0, 1]  # k beyond the vocabulary: all


def test_top_p_keeps_the_token_whose_mass_crosses_p():
    """Probabilities 0.5, 0.25, 0.125, 0.125 (exact in binary). Catches the crossing token dropped
    (the mass up to and including a token compared with p) and the boundary taken the other way: a
    token goes only when the mass before it already reaches p."""
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
    assert kept(logits, Sampling(temperature=1.0, top_p=0.6)) == [0, 1]  # 0.5 < 0.6: the 0.25 token crosses it
    assert kept(logits, Sampling(temperature=1.0, top_p=0.74)) == [0, 1]  # 0.75 before the third: it goes
    assert kept(logits, Sampling(temperature=1.0, top_p=0.76)) == [0, 1, 2]  # 0.75 < 0.76: the third crosses it
    assert kept(logits, Sampling(temperature=1.0, top_p=0.4)) == [0]  # the top token always stays
    renormalized = probabilities(logits, Sampling(temperature=1.0, top_p=0.6))
    assert torch.allclose(renormalized, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]))


def test_top_p_at_a_tie_on_the_boundary_keeps_the_lower_token_id():
    """The one place the kit differs from transformers (documented in `probabilities` and the
    README): when tied tokens straddle p, both keep the same number of tokens and the same mass, but
    the kit keeps the lower token ids and transformers the higher ones. Catches an unstable sort, whose
    order among many ties is not the token ids' (which ids stay would then be an accident of the
    sort's implementation)."""
    logits = torch.tensor([0.4, 0.3, 0.3]).log()
    sampling = Sampling(temperature=1.0, top_p=0.5)
    assert kept(logits, sampling) == [0, 1]
    theirs = torch.nonzero(transformers_probabilities(logits, sampling) > 0)[:, 0].tolist()
    assert theirs == [0, 2]
    tied = torch.zeros(64)  # 64 equal tokens: top-p 0.5 keeps 32 of them, the lowest ids
    assert kept(tied, sampling) == list(range(32))


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0, top_k=5), Sampling(temperature=0.7, top_p=0.8),
                                      Sampling(temperature=1.3, top_k=10, top_p=0.5),
                                      Sampling(temperature=0.5, top_k=3, top_p=0.95)])
def test_the_filters_equal_transformers_warpers_on_random_logits(sampling):
    """Catches another order of the filters (top-p before top-k, temperature after them) and a
    top-p computed over the unfiltered distribution: transformers applies temperature, top-k, then
    top-p over what top-k left. Logits without ties (where the two sorts cannot differ)."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(40, generator=generator) * 3
        assert torch.allclose(probabilities(logits, sampling), transformers_probabilities(logits, sampling), atol=1e-6)


def test_top_k_ties_equal_transformers_on_rounded_logits():
    """Logits rounded to whole numbers, so ties at the k-th largest are common."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        logits = (torch.randn(12, generator=generator) * 2).round()
        sampling = Sampling(temperature=1.0, top_k=4)
        assert torch.allclose(probabilities(logits, sampling), transformers_probabilities(logits, sampling), atol=1e-6)


def test_sampling_draws_from_the_filtered_distribution():
    """Catches a sampler that ignores the filters or draws from the raw logits: 4,000 seeded draws
    land within sampling noise of the filtered probabilities and never on a filtered-out token."""
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
    probs = probabilities(logits, Sampling(temperature=1.0, top_p=0.6))
    draws = sample(probs.expand(4000, -1), torch.Generator().manual_seed(0))
    frequencies = torch.bincount(draws, minlength=4) / 4000
    assert frequencies[2:].sum() == 0
    assert abs(float(frequencies[0]) - 2 / 3) < 0.03  # 4 standard errors


def test_greedy_tokens_are_the_argmax_of_the_logits_as_given():
    # the fp32 copy is for speed only: the same tokens, ties to the first index, in bf16 and fp32 alike
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(0)).bfloat16()
    logits[3, [7, 900]] = logits[3].max() + 1  # a tie: the first index wins
    assert torch.equal(greedy_tokens(logits), logits.argmax(-1)) and int(greedy_tokens(logits)[3]) == 7
    assert torch.equal(greedy_tokens(logits.float()), logits.float().argmax(-1))
    assert greedy_tokens(logits[0]).ndim == 0
