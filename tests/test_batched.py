"""Batched decoding is lossless per row: in fp32 every row of a batch equals its prompt's own batch-1
AR greedy output, whatever the other rows do (different prompt lengths, ragged acceptance, rows that
finish at different steps), and batched speculative sampling follows the target's distribution."""

import pytest
import torch

from specdec_lab.decoders import autoregressive, batched
from specdec_lab.decoders.batched import BatchedDraft, PerRow, RaggedCache
from specdec_lab.decoders.candidates import Candidates, PromptLookupCandidates
from specdec_lab.sampling import Sampling
from test_speculative import (SMALL_DRAFT, SMALL_PROMPT, SMALL_TARGET, SMALL_VOCAB, STEPS, exact_marginals,
                              total_variation, tv_limit)
from tiny import copy_llama, tiny_llama

TARGET = tiny_llama(seed=0)
DRAFT = tiny_llama(seed=1, layers=1)
# prompts of different lengths: a row's left padding and its neighbours' must stay invisible
PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 40], [1, 22, 23, 24, 25], [1, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70]]


def alone(prompt, max_new_tokens, stop_ids=(), model=TARGET):
    return autoregressive.generate(model, prompt, max_new_tokens, stop_ids=stop_ids).tokens


def stop_that_ends_one_row_early(row=1, model=TARGET, prompts=PROMPTS):
    """A stop id that prompt `row`'s own greedy text reaches from its 4th token on (and no other prompt's
    in its first 6), so that row finishes while the others go on."""
    texts = [alone(prompt, 24, model=model) for prompt in prompts]
    for token in texts[row][3:]:
        if token not in texts[row][:3] and all(token not in text[:6] for i, text in enumerate(texts) if i != row):
            return token
    raise AssertionError("no suitable stop token in the tiny model's text")


def test_batched_ar_rows_equal_each_prompts_own_ar():
    results = batched.generate_ar(TARGET, PROMPTS, 24, stop_ids=[])
    assert [r.tokens for r in results] == [alone(prompt, 24) for prompt in PROMPTS]
    assert all(r.target_forwards == 24 and r.token_steps == list(range(24)) for r in results)


def test_batched_ar_rows_finish_at_their_own_step():
    stop = stop_that_ends_one_row_early()
    results = batched.generate_ar(TARGET, PROMPTS, 24, stop_ids=[stop])
    assert [r.tokens for r in results] == [alone(prompt, 24, [stop]) for prompt in PROMPTS]
    lengths = [r.num_tokens for r in results]
    assert lengths[1] < 24 and len(set(lengths)) > 1  # a finished row appends nothing more
    assert results[1].target_forwards == lengths[1] < 24  # and leaves the batch
    assert results[1].wall_time_s < max(r.wall_time_s for r in results)


@pytest.mark.parametrize("generate", ["ar", "draft", "lookup"])
def test_the_longest_row_leaving_first_keeps_the_others_exact(generate):
    """The longest prompt's row finishes first: its columns (the others' left padding) are dropped, and
    every row left keeps its own cells."""
    stop = stop_that_ends_one_row_early(row=3)
    if generate == "ar":
        results = batched.generate_ar(TARGET, PROMPTS, 24, stop_ids=[stop])
    else:
        source = BatchedDraft(DRAFT, 3) if generate == "draft" else PerRow(lambda: PromptLookupCandidates(k=4))
        results = batched.generate_speculative(TARGET, source, PROMPTS, 24, stop_ids=[stop])
    assert [r.tokens for r in results] == [alone(prompt, 24, [stop]) for prompt in PROMPTS]
    assert results[3].num_tokens < 24


@pytest.mark.parametrize("k", [1, 3, 6])
def test_batched_speculative_with_a_draft_equals_each_prompts_own_ar(k):
    results = batched.generate_speculative(TARGET, BatchedDraft(DRAFT, k), PROMPTS, 30, stop_ids=[])
    assert [r.tokens for r in results] == [alone(prompt, 30) for prompt in PROMPTS]
    assert all(r.draft_forwards > 0 for r in results)


def test_batched_speculative_rows_finish_at_their_own_step():
    stop = stop_that_ends_one_row_early()
    results = batched.generate_speculative(TARGET, BatchedDraft(DRAFT, 4), PROMPTS, 24, stop_ids=[stop])
    assert [r.tokens for r in results] == [alone(prompt, 24, [stop]) for prompt in PROMPTS]
    assert results[1].num_tokens < 24


def test_batched_prompt_lookup_equals_each_prompts_own_ar():
    prompts = [[1, 5, 6, 7, 5, 6, 7, 5, 6], *PROMPTS]
    results = batched.generate_speculative(TARGET, PerRow(lambda: PromptLookupCandidates(k=5)), prompts, 30, stop_ids=[])
    assert [r.tokens for r in results] == [alone(prompt, 30) for prompt in prompts]


@pytest.mark.parametrize("costs", ["flat", "steep"])
def test_batched_prompt_lookup_cut_by_cost_stays_exact_and_verifies_what_its_rows_pay_for(costs):
    """Flat T_b(n): every proposal is verified whole, as uncut; steep (each column costs more than the
    tokens any row could add to it): no proposal at all, plain steps only. Exact either way."""
    prompts = [[1, 5, 6, 7, 5, 6, 7, 5, 6], *PROMPTS]
    step_ms = {b: ({1: 10.0, 12: 10.0} if costs == "flat" else {1: 10.0, 12: 150.0}) for b in (1, 2, 4, 8)}
    results = batched.generate_speculative(TARGET, PerRow(lambda: PromptLookupCandidates(k=5), step_ms), prompts, 30,
                                           stop_ids=[])
    assert [r.tokens for r in results] == [alone(prompt, 30) for prompt in prompts]
    if costs == "flat":
        uncut = batched.generate_speculative(TARGET, PerRow(lambda: PromptLookupCandidates(k=5)), prompts, 30, stop_ids=[])
        assert [r.proposed_per_step for r in results] == [r.proposed_per_step for r in uncut]
        assert sum(sum(r.proposed_per_step) for r in results) > 0
    else:
        assert all(set(r.proposed_per_step) == {0} for r in results)


@pytest.mark.parametrize("step_ms", [None, {1: {1: 10.0, 12: 10.0}}])
def test_a_token_tree_is_refused_by_name_cut_or_not(step_ms):
    """Batches verify chains: a tree proposal is refused, also after the cost cut (which keeps its parents)."""
    from specdec_lab.decoders.candidates import PromptLookupTreeCandidates

    with pytest.raises(ValueError, match="verifies chains only"):
        batched.generate_speculative(TARGET, PerRow(lambda: PromptLookupTreeCandidates(k=4, branches=3), step_ms),
                                     [[1, 5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6]], 12, stop_ids=[])


def test_a_batchs_cut_reads_the_costs_of_the_smallest_measured_batch_that_holds_its_rows():
    step_ms = {1: {1: 1.0}, 2: {1: 2.0}, 4: {1: 4.0}}
    sources = PerRow(lambda: PromptLookupCandidates(k=5), step_ms)
    assert [sources.costs_at(rows)[1] for rows in (1, 2, 3, 4, 6)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="proposal_acceptance"):
        PerRow(lambda: OneRightOneWrong(lag=3, k=4, never=30), step_ms)


class OneRightOneWrong:
    """Row 0 proposes the copy model's true continuation (accepted whole), row 1 a token its text never
    holds (rejected at once): the rows' caches grow by different counts every step."""

    origin = "proposal"
    forwards = 0

    def __init__(self, lag, k, never):
        self.lag, self.k, self.never, self.rows = lag, k, never, [0, 1]

    def reset(self, rows, vocab_size):
        self.rows = list(range(rows))

    def propose(self, tokens, max_candidates, sampling, rng):
        proposals = []
        for row, row_tokens, limit in zip(self.rows, tokens, max_candidates):
            if row == 0:
                text = list(row_tokens)
                for _ in range(min(self.k, limit)):
                    text.append(text[-self.lag])
                proposals.append(Candidates(text[len(row_tokens):]))
            else:
                proposals.append(Candidates([self.never] * min(self.k, limit)))
        return proposals

    def update(self, tokens, num_accepted, num_proposed):
        pass

    def select(self, rows):
        self.rows = [self.rows[row] for row in rows]


def test_one_row_accepting_everything_beside_one_rejecting_everything():
    """The copy model reads positions from its cache: a row's cache cropped to the other row's length,
    or a rejected cell left visible, changes its next token."""
    copy = copy_llama(lag=3)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 10, 11, 12]]
    results = batched.generate_speculative(copy, OneRightOneWrong(lag=3, k=4, never=30), prompts, 20, stop_ids=[])
    assert [r.tokens for r in results] == [alone(prompt, 20, model=copy) for prompt in prompts]
    everything, nothing = results
    assert everything.accepted_per_step[:-1] == everything.proposed_per_step[:-1] and everything.num_tokens == 20
    assert sum(nothing.accepted_per_step) == 0 and nothing.target_forwards == 20
    assert everything.target_forwards < nothing.target_forwards  # it finished first and left the batch


def consistent(cache):
    """The cache's bookkeeping agrees with itself: one `valid` column per cell of every layer, and each
    row's valid cells counted by its length."""
    cells = {layer.keys.shape[-2] for layer in cache.cache.layers}
    return cells == {cache.valid.shape[1]} and cache.valid.sum(1).tolist() == cache.lengths


def test_ragged_cache_keeps_each_rows_tokens_apart():
    """Row by row, a batched forward's logits equal a forward of that row's tokens alone, after a
    truncation that leaves holes in one row only, a compaction, and a row leaving the batch."""
    cache = RaggedCache(TARGET, 3)
    cache.forward([[1, 5, 6, 7], [1, 9], [1, 2, 3, 4, 5, 6, 7, 8]], keep=1)
    cache.forward([[8, 9, 10], [11], [9]], keep=1)
    cache.truncate(0, 5)  # row 0 keeps 1 5 6 7 8; cells of 9 and 10 become holes
    cache.truncate(1, 2)  # row 1 drops 11
    assert consistent(cache)
    logits = cache.forward([[12], [13, 14], [10]], keep=1)[:, -1]
    texts = [[1, 5, 6, 7, 8, 12], [1, 9, 13, 14], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    for row, tokens in enumerate(texts):
        torch.testing.assert_close(logits[row], TARGET(torch.tensor([tokens], device=TARGET.device)).logits[0, -1], atol=1e-4, rtol=1e-4)
    cache.select([0, 1])  # the longest row leaves: its columns of left padding for the others go too
    columns = cache.valid.shape[1]
    cache.compact()
    assert cache.valid.shape[1] < columns and consistent(cache) and cache.lengths == [6, 4]
    logits = cache.forward([[15], [16]], keep=1)[:, -1]
    for row, tokens in enumerate([texts[0] + [15], texts[1] + [16]]):
        torch.testing.assert_close(logits[row], TARGET(torch.tensor([tokens], device=TARGET.device)).logits[0, -1], atol=1e-4, rtol=1e-4)
    assert consistent(cache)


def tiny_gemma2():
    """A tiny Gemma 2: its cache mixes sliding-window layers (which count their own cells) with full ones."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=128,
                          max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    return Gemma2ForCausalLM(config).float().eval()


def test_a_cache_with_sliding_window_layers_stays_exact_through_holes_and_refuses_the_window():
    gemma = tiny_gemma2()
    prompts = [[1, 5, 6, 7, 5, 6, 7, 5, 6], *PROMPTS]
    results = batched.generate_speculative(gemma, PerRow(lambda: PromptLookupCandidates(k=4)), prompts, 24, stop_ids=[])
    assert [r.tokens for r in results] == [alone(prompt, 24, model=gemma) for prompt in prompts]
    cache = RaggedCache(gemma, 3)  # a sliding layer reports the cells it counted as the cache's length
    cache.forward([[1, 5, 6, 7], [1, 9], [1, 2, 3, 4, 5, 6, 7, 8]], keep=1)
    cache.select([0, 1])
    cache.compact()
    assert consistent(cache) and cache.cache.get_seq_length() == cache.valid.shape[1] == 4
    with pytest.raises(ValueError, match="past the model's sliding window of 128"):
        batched.generate_ar(gemma, [list(range(1, 90))], 60, stop_ids=[])


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="empty batch"):
        batched.generate_ar(TARGET, [], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        batched.generate_ar(TARGET, PROMPTS, 0)
    with pytest.raises(ValueError, match="draft length k"):
        BatchedDraft(DRAFT, 0)
    with pytest.raises(ValueError, match="one list of tokens per row"):
        RaggedCache(TARGET, 2).forward([[1, 2]], keep=1)


# --- sampling: every row follows the target's distribution ----------------------------------------------
OTHER_PROMPT = [3, 5, 0, 1]


@pytest.mark.parametrize("source", ["draft", "lookup"])
def test_batched_speculative_sampling_matches_the_target_distribution(source):
    """Rows of two prompts alternate in the batch; each prompt's tokens are counted apart. A row reading
    another row's logits or q (or its cache) would follow the other prompt's distribution."""
    sampling, rows, calls = Sampling(temperature=1.0), 200, 5
    make = (lambda: BatchedDraft(SMALL_DRAFT, 2)) if source == "draft" else (lambda: PerRow(lambda: PromptLookupCandidates(k=3, max_ngram=1)))
    counts = {0: torch.zeros(STEPS, SMALL_VOCAB), 1: torch.zeros(STEPS, SMALL_VOCAB)}
    prompts = [SMALL_PROMPT if row % 2 == 0 else OTHER_PROMPT for row in range(rows)]
    for call in range(calls):
        results = batched.generate_speculative(SMALL_TARGET, make(), prompts, STEPS, Sampling(1.0, seed=call), stop_ids=[])
        for row, result in enumerate(results):
            for position, token in enumerate(result.tokens):
                counts[row % 2][position, token] += 1
    samples = rows * calls // 2
    for which, prompt in enumerate([SMALL_PROMPT, OTHER_PROMPT]):
        exact = exact_marginals(SMALL_TARGET, prompt, STEPS, sampling)
        worst = max(total_variation(exact[t], counts[which][t] / samples) for t in range(STEPS))
        assert worst < tv_limit(samples), (prompt, worst)


def test_the_target_drafting_for_itself_accepts_everything_after_a_row_leaves():
    """The draft's cache follows the batch: once a row has left, every row still drafts from its own
    cache (a draft reading another row's cache would propose that row's text, and be rejected)."""
    stop = stop_that_ends_one_row_early()
    results = batched.generate_speculative(TARGET, BatchedDraft(TARGET, 3), PROMPTS, 24, stop_ids=[stop])
    assert [r.tokens for r in results] == [alone(prompt, 24, [stop]) for prompt in PROMPTS]
    for result in results:
        assert result.accepted_per_step[:-1] == result.proposed_per_step[:-1], result.accepted_per_step


def test_per_row_sources_follow_their_rows_when_one_leaves():
    made = iter(range(10))
    sources = PerRow(lambda: PromptLookupCandidates(k=next(made) + 1))
    sources.reset(rows=4, vocab_size=None)
    before = [source.k for source in sources.sources]
    sources.select([0, 2, 3])
    assert [source.k for source in sources.sources] == [before[0], before[2], before[3]]


def test_transformers_batched_generate_equals_each_prompts_own_ar():
    from specdec_lab.decoders import hf_peers

    stop = stop_that_ends_one_row_early()
    results = hf_peers.generate_batch(TARGET, PROMPTS, 24, stop_ids=[stop])
    assert [r.tokens for r in results] == [alone(prompt, 24, [stop]) for prompt in PROMPTS]
    assert len({r.wall_time_s for r in results}) == 1 and results[0].target_forwards == 24
