"""Speculative decoding is lossless: greedy equals AR greedy token for token in fp32, and
sampling follows the target's distribution exactly (a wrong acceptance rule is caught)."""

from collections import Counter

import pytest
import torch

from specdec_lab import cost_model
from specdec_lab.decoders import autoregressive, common, speculative, trees
from specdec_lab.decoders.candidates import (Candidates, DraftLength, DraftModelCandidates, DraftTreeCandidates, HybridCandidates,
                                            PromptLookupCandidates, PromptLookupTreeCandidates, SuffixTrackRecord,
                                            OPENING_CATCH_UP_LIMIT, SUFFIX_OPENING)
from specdec_lab.decoders.backend import open_sequence
from specdec_lab.decoders.suffix import SuffixCandidates, SuffixTrie
from specdec_lab.method import HybridSettings, SuffixSettings
from specdec_lab.models import check_same_tokenizer
from specdec_lab.result import PROMPT_LOOKUP, SUFFIX
from specdec_lab.sampling import GREEDY, Sampling, probabilities
from tiny import PROMPT, copy_llama, tiny_llama

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
    result = speculative.generate(TARGET, DraftModelCandidates(TARGET, 4), PROMPT, 40, stop_ids=[])
    assert result.tokens == ar(40)
    # 8 steps of 4 accepted + 1 of the target's own; the first step's forward is the prefill
    assert result.accepted_per_step == [4] * 8 and result.target_forwards == 8


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


class RecordingDraft(DraftModelCandidates):
    """A draft model that keeps every (sequence, proposal) pair it was asked for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposals = []

    def propose(self, tokens, max_candidates, sampling, rng):
        candidates = super().propose(tokens, max_candidates, sampling, rng)
        self.proposals.append((list(tokens), candidates.token_ids))
        return candidates


def test_the_draft_proposes_its_own_greedy_continuation_after_rejections():
    """Catches a draft KV cache not rolled back after a rejection. The output stays right (the
    target decides every token), but the draft then drafts after tokens the target rejected."""
    draft = RecordingDraft(DRAFT, 4)
    result = speculative.generate(TARGET, draft, PROMPT, 40, stop_ids=[])
    assert result.tokens == ar(40)
    # drafted tokens past the last accepted one were in the draft's cache and had to be dropped
    assert sum(a < p - 1 for a, p in zip(result.accepted_per_step, result.proposed_per_step)) >= 3
    checked = 0
    for tokens, proposal in draft.proposals:
        if proposal:
            with torch.inference_mode():
                own = autoregressive.decode_tokens(DRAFT, tokens, len(proposal), GREEDY, None, frozenset())
            assert proposal == own
            checked += 1
    assert checked == len(result.accepted_per_step) - 1  # all but the last step drafted something


def test_the_target_cache_keeps_the_accepted_prefix_only():
    """Catches a target cache that keeps a rejected draft token: verify [a, b, wrong, d] after the
    target's own first token, then the next forward must see exactly prompt + first + a + b."""
    free = ar(5)
    tokens = PROMPT + free[:1]
    sequence = open_sequence(TARGET)
    autoregressive.prefill(sequence, PROMPT)  # the cache holds every token but the last
    wrong = (free[3] + 1) % TARGET.config.vocab_size
    candidates = Candidates([free[1], free[2], wrong, free[4]])
    accepted, token = speculative.speculative_step(sequence, tokens, candidates, GREEDY, None)
    assert (accepted, token) == (free[1:3], free[3])
    assert sequence.length == len(tokens) + len(accepted)
    with torch.inference_mode():
        cached = sequence.forward([token], keep=1)[-1]
        fresh = TARGET(torch.tensor([tokens + free[1:3] + [token]], device=TARGET.device)).logits[0, -1]
    assert torch.allclose(cached, fresh, atol=1e-5)


@pytest.mark.parametrize("tokens, k, expected", [
    ([1, 2, 3, 4, 5, 6, 2, 3], 3, [4, 5, 6]),  # the last bigram [2, 3] occurred at 1: what followed it
    ([7, 8, 1, 7, 9, 2, 7], 2, [9, 2]),  # the latest earlier [7], not the first one
    ([5, 6, 9, 1, 6, 8, 5, 6], 2, [9, 1]),  # the longer n-gram [5, 6] wins over a later [6]
    ([3, 4, 3], 5, [4, 3]),  # what followed runs up to the end of the sequence
    ([1, 2, 3, 4], 3, []),  # no earlier occurrence: nothing to propose
])
def test_prompt_lookup_proposes_the_tokens_that_followed_the_match(tokens, k, expected):
    """Catches an off-by-one in the proposed slice, which decoding alone never shows (the output
    stays lossless, only fewer proposals are accepted)."""
    assert PromptLookupCandidates(k, match="latest").propose(tokens, 10, GREEDY, None).token_ids == expected
    assert PromptLookupCandidates(k, match="latest").propose(tokens, 1, GREEDY, None).token_ids == expected[:1]


@pytest.mark.parametrize("tokens, k, expected", [
    # the end [1, 2, 3, 4] matches at 0-3 for 4 tokens, at 7-9 for 3 ([2, 3, 4]; the latest 3-gram)
    ([1, 2, 3, 4, 9, 8, 7, 2, 3, 4, 5, 6, 1, 2, 3, 4], 2, [9, 8]),
    ([5, 1, 7, 5, 1, 8, 5, 1], 3, [7, 5, 1]),  # two matches of length 2: the earliest (the prompt's)
    ([3, 4, 3], 5, [4, 3]),  # what followed runs up to the end of the sequence
    ([1, 2, 3, 4], 3, []),  # no earlier occurrence: nothing to propose
])
def test_longest_match_prompt_lookup_proposes_what_followed_the_longest_match(tokens, k, expected):
    assert PromptLookupCandidates(k).propose(tokens, 10, GREEDY, None).token_ids == expected
    assert PromptLookupCandidates(k).propose(tokens, 1, GREEDY, None).token_ids == expected[:1]


def test_prompt_lookup_extends_matches_that_keep_matching_and_stops_where_they_are_rejected():
    """Per kind of match (its length): a block accepted whole makes the next proposal 2 longer, a
    rejection 1 shorter; a kind that keeps being rejected proposes nothing while other kinds go on."""
    lookup = PromptLookupCandidates(3, min_tries=2, min_accepted_per_step=0.5)
    long_match = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3]  # the end [1, 2, 3] matched for 3 tokens at 0-2
    short_match = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 4]  # the end [4] matched for 1 token
    assert lookup.propose(long_match, 20, GREEDY, None).token_ids == [4, 5, 6]
    lookup.update(long_match + [4, 5, 6, 7], 3, 3)
    assert lookup.propose(long_match, 20, GREEDY, None).token_ids == [4, 5, 6, 7, 8]  # extended by 2
    assert lookup.propose(short_match, 20, GREEDY, None).token_ids == [5, 6, 7]  # another kind: from k
    for _ in range(2):
        lookup.propose(short_match, 20, GREEDY, None)
        lookup.update(short_match + [0], 0, 3)
    assert lookup.propose(short_match, 20, GREEDY, None).token_ids == []  # 0 accepted per step: stopped
    assert len(lookup.propose(long_match, 20, GREEDY, None).token_ids) == 5  # long matches go on
    lookup.reset()
    assert lookup.propose(short_match, 20, GREEDY, None).token_ids == [5, 6, 7]  # nothing carries over


LONG_MATCH = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4]  # the end matched for 4 tokens: alpha 4/5 at first
SHORT_MATCH = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 4]  # the end [4] matched for 1 token: alpha 1/2 at first


def test_a_cost_sized_lookup_keeps_the_tokens_worth_verifying_and_nothing_where_none_pays():
    """Each proposal is cut to argmax_n (1 + P(1) + ... + P(n)) / (T(n + 1) / T(1)), P(i) the chance that its
    first i tokens are accepted (at a 4-token match's prior, 0.8^i). Catches the target's own token left out
    of the count, T(n) read one off, and a flat curve cutting anything."""
    flat = PromptLookupCandidates(3, relative_target={1: 1.0, 32: 1.0})
    assert flat.propose(LONG_MATCH, 20, GREEDY, None).token_ids == PromptLookupCandidates(3).propose(
        LONG_MATCH, 20, GREEDY, None).token_ids == [5, 6, 7]
    # P(i) = 0.8^i: 1 token gives 1.8 for 1.0, 2 give 2.44 for 1.3 (1.88), 3 give 2.95 for 2.0 (1.48)
    steep = {1: 1.0, 2: 1.0, 3: 1.3, 4: 2.0, 7: 6.0}
    lookup = PromptLookupCandidates(3, relative_target=steep)
    assert lookup.accepted_first(3, 3) == pytest.approx([0.8, 0.64, 0.512])  # a 4-token match's prior
    assert lookup.propose(LONG_MATCH, 20, GREEDY, None).token_ids == [5, 6]
    # a one-token match (P(1) = 0.5): 1.5 tokens for T(2) = 1.6 steps is worse than a plain step
    dear = PromptLookupCandidates(3, relative_target={1: 1.0, 2: 1.6, 7: 6.0})
    assert dear.propose(SHORT_MATCH, 20, GREEDY, None).token_ids == [] and dear.kind is None


def test_a_cost_sized_lookup_follows_its_kind_of_matchs_record():
    """Position by position: a token accepted raises its position's share and lengthens the cut proposals,
    a first token rejected lowers the first position's only, and the target's own token judges the first
    token a cut left out (also where the cut left nothing). Catches rejections left uncounted, positions
    after a rejection counted as tried, one kind's record read for another's, and a cut proposal that can
    never learn what it cut."""
    curve = {1: 1.0, 2: 1.0, 3: 1.3, 4: 1.6, 5: 2.0, 7: 6.0, 9: 8.0}  # worth 2 tokens at the prior, 3 after
    lookup = PromptLookupCandidates(3, relative_target=curve)
    assert lookup.propose(LONG_MATCH, 20, GREEDY, None).token_ids == [5, 6]
    # accepted whole, and the target's own token is the 7 the cut left out: positions 1-3 at (1 + 0.8) / 2
    lookup.update(LONG_MATCH + [5, 6, 7], 2, 2)
    assert lookup.accepted_first(3, 3) == pytest.approx([0.9, 0.81, 0.729])
    assert lookup.propose(LONG_MATCH, 20, GREEDY, None).token_ids == [5, 6, 7]
    other = PromptLookupCandidates(3, relative_target=curve)
    other.propose(LONG_MATCH, 20, GREEDY, None)
    other.update(LONG_MATCH + [5, 6, 0], 2, 2)  # the token after the cut judged wrong: position 3 at 0.8 / 2
    assert other.accepted_first(3, 3) == pytest.approx([0.9, 0.81, 0.324])
    dear = PromptLookupCandidates(3, relative_target={1: 1.0, 2: 1.6, 7: 6.0})
    assert dear.propose(SHORT_MATCH, 20, GREEDY, None).token_ids == []
    dear.update(SHORT_MATCH + [5], 0, 0)  # cut to nothing, the plain step's token still judges position 1
    assert dear.accepted_first(0, 1) == pytest.approx([0.75])
    assert lookup.accepted_first(0, 1) == pytest.approx([0.5])  # the one-token kind keeps its own prior
    for _ in range(4):
        lookup.propose(LONG_MATCH, 20, GREEDY, None)
        lookup.update(LONG_MATCH + [0], 0, 3)  # the first token rejected: the later two were never judged
    assert lookup.accepted_first(3, 3) == pytest.approx([0.3, 0.27, 0.243])
    assert lookup.propose(LONG_MATCH, 20, GREEDY, None).token_ids == [5]
    lookup.reset()
    assert lookup.accepted_first(3, 1) == pytest.approx([0.8])  # nothing carries over


def test_a_cost_sized_lookup_is_lossless():
    repetitive = PROMPT + PROMPT[3:] + PROMPT
    expected = autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
    lookup = PromptLookupCandidates(4, relative_target={1: 1.0, 2: 1.05, 4: 1.3, 9: 3.0})
    result = speculative.generate(TARGET, lookup, repetitive, 40, stop_ids=[])
    assert result.tokens == expected and sum(result.accepted_per_step) > 0


def test_a_cut_by_cost_needs_the_longest_match_rule_and_a_curve():
    with pytest.raises(ValueError, match="match='longest'"):
        PromptLookupCandidates(4, match="latest", relative_target={1: 1.0, 2: 1.1})
    with pytest.raises(ValueError, match="needs the target's measured T"):
        PromptLookupCandidates(4, relative_target={})


@pytest.mark.parametrize("match", ["latest", "longest"])
def test_both_prompt_lookup_rules_are_lossless_on_text_with_repeats(match):
    repetitive = PROMPT + PROMPT[3:] + PROMPT
    expected = autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
    result = speculative.generate(TARGET, PromptLookupCandidates(4, match=match), repetitive, 40, stop_ids=[])
    assert result.tokens == expected and sum(result.accepted_per_step) > 0


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


# --- one verification step is exact -----------------------------------------------------------
# A target whose next-token distribution depends on the position only (row j of ROWS) lets one
# step be checked alone: the step's tokens, then plain samples from ROWS for the positions it did
# not reach, must be distributed as ROWS, row by row, whatever the draft proposed.
ROWS = torch.tensor([[.6, .2, .1, .1], [.1, .1, .6, .2], [.2, .6, .1, .1], [.1, .1, .2, .6]])
DRAFT_ROWS = torch.tensor([[.3, .5, .1, .1], [.1, .1, .2, .6], [.6, .2, .1, .1]])  # unlike ROWS and each other
TRIALS = 2000


def one_step_frequencies(propose):
    """Per-position token frequencies over TRIALS seeded steps, and how many tokens each step accepted."""
    rng = torch.Generator().manual_seed(0)
    counts, accepted_counts = torch.zeros_like(ROWS), Counter()
    for _ in range(TRIALS):
        candidates = propose(rng)
        accepted, token = speculative.accept_sampled(ROWS.log(), candidates, Sampling(temperature=1.0), rng)
        rest = torch.multinomial(ROWS, 1, generator=rng)[:, 0].tolist()
        tokens = candidates.token_ids[:accepted] + [token] + rest[accepted + 1:]
        counts[torch.arange(len(ROWS)), torch.tensor(tokens)] += 1
        accepted_counts[accepted] += 1
    return counts / TRIALS, accepted_counts


def drafted(rng):
    return Candidates(torch.multinomial(DRAFT_ROWS, 1, generator=rng)[:, 0].tolist(), DRAFT_ROWS)


def looked_up(rng):  # deterministic proposals, as from prompt lookup: q is one-hot on them
    return Candidates([0, 2, 1])


@pytest.mark.parametrize("propose", [drafted, looked_up])
def test_one_speculative_step_samples_every_position_from_the_target(propose):
    """Catches, in rejection sampling: resampling from p instead of norm(max(0, p - q)), q read at
    another draft position than the token's, the bonus token drawn from the wrong row, and
    deterministic proposals weighed with a q other than one-hot (uniform, or p)."""
    frequencies, accepted = one_step_frequencies(propose)
    worst = max(total_variation(frequencies[j], ROWS[j]) for j in range(len(ROWS)))
    assert worst < 0.06, worst  # a correct step: ~0.02 (sampling noise); the bugs above: 0.1 or more
    # every outcome happened: rejection at each position (the second and third included) and all accepted
    assert all(accepted[n] >= TRIALS // 50 for n in range(len(ROWS))), accepted


# --- one tree verification step is exact ------------------------------------------------------------
# A position-only target over a tree: two children of the root drawn without replacement from
# TREE_DRAFT_ROWS[0], two under each of them from row 1, one under each of those from row 2. Row 1 + i
# of the target's logits (after node i) is TREE_ROWS[depth of node i]. p exceeds q on two tokens of
# every row, so after a rejection the residual keeps two tokens and a later sibling's test is a real
# one (with ROWS and DRAFT_ROWS the residual is one-hot and every later sibling's test is certain).
TREE_ROWS = torch.tensor([[.4, .3, .2, .1], [.1, .4, .3, .2], [.2, .1, .4, .3], [.3, .2, .1, .4]])
TREE_DRAFT_ROWS = torch.tensor([[.1, .2, .3, .4], [.4, .1, .2, .3], [.3, .4, .1, .2]])
TREE_TRIALS = 6000  # a rejected sibling left in q moves a marginal by ~0.04: 3x the noise at this count
TREE_PARENTS = [-1, -1, 0, 0, 1, 1, 2, 3, 4, 5]
TREE_DEPTHS = [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]


def drafted_tree(rng):
    """TREE_PARENTS' shape, each node's siblings drawn without replacement from its depth's draft row."""
    token_ids, rows = [None] * len(TREE_PARENTS), [None] * len(TREE_PARENTS)
    for parent in (-1, *range(len(TREE_PARENTS))):
        below = [node for node, above in enumerate(TREE_PARENTS) if above == parent]
        if below:
            row = TREE_DRAFT_ROWS[TREE_DEPTHS[below[0]] - 1]
            for node, token in zip(below, torch.multinomial(row, len(below), replacement=False, generator=rng).tolist()):
                token_ids[node], rows[node] = token, row
    return Candidates(token_ids, torch.stack(rows), TREE_PARENTS)


def looked_up_tree(rng):  # a deterministic trie, as from prompt-lookup trees: q is one-hot on each node
    return Candidates([0, 1, 2, 1, 1, 0], None, [-1, -1, 0, 0, 1, 4])


def one_tree_step_frequencies(propose, accept=trees.accept_tree_sampled):
    """Per-position token frequencies over TREE_TRIALS seeded tree steps, and which outcomes happened:
    ("second", depth) a second sibling accepted, ("none", depth) every child of a node rejected."""
    rng = torch.Generator().manual_seed(0)
    counts, outcomes = torch.zeros_like(TREE_ROWS), Counter()
    for _ in range(TREE_TRIALS):
        tree = propose(rng)
        logits = TREE_ROWS[[0, *(d for d in trees.depths(tree.parents))]].log()
        path, token = accept(logits, tree, Sampling(temperature=1.0), rng)
        for node in path:
            siblings = [n for n, above in enumerate(tree.parents) if above == tree.parents[node]]
            if siblings.index(node) > 0:
                outcomes["second", trees.depths(tree.parents)[node] - 1] += 1
        if trees.children(tree.parents)[(path[-1] if path else -1) + 1]:
            outcomes["none", len(path)] += 1
        rest = torch.multinomial(TREE_ROWS, 1, generator=rng)[:, 0].tolist()
        tokens = [tree.token_ids[node] for node in path] + [token] + rest[len(path) + 1:]
        counts[torch.arange(len(TREE_ROWS)), torch.tensor(tokens)] += 1
    return counts / TREE_TRIALS, outcomes


@pytest.mark.parametrize("propose", [drafted_tree, looked_up_tree])
def test_one_tree_step_samples_every_position_from_the_target(propose):
    """Catches, in multi-step speculative sampling over a tree: a residual not updated between
    siblings, q read at another node than the one tried (its parent's), a rejected sibling left in q
    (sampled without replacement, it cannot come again), and the bonus token from the wrong node's row."""
    frequencies, outcomes = one_tree_step_frequencies(propose)
    worst = max(total_variation(frequencies[j], TREE_ROWS[j]) for j in range(len(TREE_ROWS)))
    assert worst < 0.03, worst  # a correct step: ~0.01; the bugs above: 0.04 or more
    # second siblings accepted at the root and below it, and every child of a node rejected below the root
    assert min(outcomes["second", 0], outcomes["second", 1], outcomes["none", 1]) >= TREE_TRIALS // 50, outcomes


# --- sampling is exact in distribution, end to end -------------------------------------------

class _Unmeasured:
    """Stands in for PeakMemory: no gc pass and no sampler thread around every generation."""
    peak_bytes = None

    def __init__(self, device):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture
def unmeasured(monkeypatch):
    """The checks below run thousands of 4-token generations: the per-call peak-memory measurement
    (a full gc pass each) would take most of their time and is beside their point."""
    monkeypatch.setattr(common, "PeakMemory", _Unmeasured)


SMALL_VOCAB = 6
SMALL_TARGET = tiny_llama(seed=10, vocab_size=SMALL_VOCAB, layers=1, hidden=16, head_std=0.3)
# A draft unlike the target whose proposal moves with the position: it prefers the token three back
# (by 2 in logits), so q differs from p and from one block position to the next, and an acceptance
# test reading q at the wrong position shows.
SMALL_DRAFT = copy_llama(lag=3, vocab_size=SMALL_VOCAB, scale=2.0)
SMALL_PROMPT = [1, 2, 4]
STEPS = 4  # a block of two drafted tokens verified with the prefill, the target's own, one more
SAMPLES = 1000


@torch.inference_mode()
def exact_marginals(model, prompt, steps, sampling):
    """Exact P(token at position t) for t < steps, by enumerating every prefix (vocab 6)."""
    paths = {(): 1.0}
    marginals = []
    for _ in range(steps):
        nxt, marginal = {}, torch.zeros(SMALL_VOCAB)
        for path, mass in paths.items():
            logits = model(torch.tensor([prompt + list(path)], device=model.device)).logits[0, -1].cpu()
            p = probabilities(logits, sampling)
            marginal += mass * p
            for token in range(SMALL_VOCAB):
                nxt[path + (token,)] = mass * float(p[token])
        paths, marginals = nxt, marginals + [marginal]
    return marginals


def total_variation(p, q):
    return 0.5 * float((p - q).abs().sum())


def worst_tv(candidates, prompt, sampling, samples=SAMPLES):
    """The largest TV between the target's exact marginals and speculative decoding's empirical ones
    over positions 0..STEPS-1 (`samples` seeds), and the steps that verified two or more drafted
    tokens and rejected one after the first (where q's position matters)."""
    exact = exact_marginals(SMALL_TARGET, prompt, STEPS, sampling)
    counts, late_rejections = torch.zeros(STEPS, SMALL_VOCAB), 0
    for seed in range(samples):
        seeded = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed=seed)
        result = speculative.generate(SMALL_TARGET, candidates, prompt, STEPS, seeded, stop_ids=[])
        for position, token in enumerate(result.tokens):
            counts[position, token] += 1
        late_rejections += sum(1 <= a < p for a, p in zip(result.accepted_per_step, result.proposed_per_step))
    return max(total_variation(exact[t], counts[t] / samples) for t in range(STEPS)), late_rejections


def tv_limit(samples):
    """About twice the TV sampling noise alone gives a correct sampler (it shrinks as 1/sqrt(n));
    the runs are seeded, so the outcome is reproducible."""
    return 2 / samples ** 0.5


@pytest.mark.usefixtures("unmeasured")
@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=4, top_p=0.9),
                                      Sampling(temperature=1.0, top_k=2), Sampling(temperature=1.0, top_p=0.6)])
def test_speculative_sampling_matches_the_target_distribution(sampling):
    """Catches a wrong residual and q read at another draft position (q[i - 1], q[0]): a correct
    sampler lands near TV 0.04, those bugs at 0.1 to 0.45. Under top-k and top-p alone the target's
    exact marginals are those of its filtered distribution: a sampler that filters q but not p (or
    the other way) lands far from them."""
    worst, late_rejections = worst_tv(DraftModelCandidates(SMALL_DRAFT, 2), SMALL_PROMPT, sampling)
    assert worst < tv_limit(SAMPLES), worst
    assert late_rejections >= 100, late_rejections  # blocks of two, rejected at the second token, happened


@pytest.mark.usefixtures("unmeasured")
def test_prompt_lookup_sampling_matches_the_target_distribution():
    """Catches prompt lookup's deterministic proposals weighed with a q other than one-hot on them
    (uniform, or p): a correct sampler lands near TV 0.05, those bugs above 0.3."""
    prompt = [1, 2, 4, 5, 1, 2, 4]  # a repeat: prompt lookup proposes what followed it
    samples = 600
    worst, late_rejections = worst_tv(PromptLookupCandidates(3), prompt, Sampling(temperature=1.0), samples)
    assert worst < tv_limit(samples), worst
    assert late_rejections >= 20, late_rejections


@pytest.mark.usefixtures("unmeasured")
@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=3)])
def test_draft_tree_sampling_matches_the_target_distribution(sampling):
    """The draft tree end to end: children drawn without replacement, verified by the tree sampler."""
    tree = DraftTreeCandidates(SMALL_DRAFT, depth=2, branching=2, beam=2)
    worst, _ = worst_tv(tree, SMALL_PROMPT, sampling)
    assert worst < tv_limit(SAMPLES), worst


@pytest.mark.usefixtures("unmeasured")
def test_fixed_shape_draft_tree_sampling_matches_the_target_distribution():
    """Sequoia's shape under sampling: as many children as the shape gives, drawn without replacement."""
    tree = DraftTreeCandidates(SMALL_DRAFT, shape=[(-1, 0), (-1, 1), (-1, 2), (0, 0), (1, 0)])
    worst, _ = worst_tv(tree, SMALL_PROMPT, Sampling(temperature=1.0))
    assert worst < tv_limit(SAMPLES), worst


@pytest.mark.usefixtures("unmeasured")
def test_prompt_lookup_tree_sampling_matches_the_target_distribution():
    prompt = [1, 2, 4, 5, 1, 2, 3, 1, 2]  # "1 2" twice before the end: a trie of two branches
    samples = 600
    worst, _ = worst_tv(PromptLookupTreeCandidates(3, branches=2), prompt, Sampling(temperature=1.0), samples)
    assert worst < tv_limit(samples), worst


@pytest.mark.usefixtures("unmeasured")
def test_a_wrong_rejection_rule_fails_the_same_check(monkeypatch):
    """The classic bug: on rejection, resample from p instead of norm(max(0, p - q))."""
    def resample_from_p(target_logits, candidates, sampling, rng):
        p = probabilities(target_logits, sampling)
        q = candidates.probs
        for i, x in enumerate(candidates.token_ids):
            if torch.rand((), generator=rng, device=p.device) >= torch.clamp(p[i, x] / q[i, x], max=1.0):
                return i, int(torch.multinomial(p[i], 1, generator=rng))
        return len(candidates.token_ids), int(torch.multinomial(p[-1], 1, generator=rng))

    monkeypatch.setattr(speculative, "accept_sampled", resample_from_p)
    worst, _ = worst_tv(DraftModelCandidates(SMALL_DRAFT, 2), SMALL_PROMPT, Sampling(temperature=1.0))
    assert worst > tv_limit(SAMPLES), worst


# --- the hybrid candidate source --------------------------------------------------------------------

def hybrid(draft=DRAFT, **kwargs):
    return HybridCandidates(draft, **({"k": 3, "prompt_lookup_k": 4} | kwargs))


def test_hybrid_is_lossless_and_uses_every_source():
    repetitive = PROMPT + [3, 4] + PROMPT[1:] + [12, 13]
    expected = autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
    for draft in (DRAFT, TARGET):  # an unrelated draft, and the target drafting for itself
        candidates = hybrid(draft, prior_acceptance=0.9, cost_ratio=0.2)
        result = speculative.generate(TARGET, candidates, repetitive, 40, stop_ids=[])
        assert result.tokens == expected
    assert {"prompt lookup", "draft model"} <= set(candidates.sources)


@torch.inference_mode()
def test_hybrid_chooses_by_match_length_and_acceptance():
    tokens = [20, 21, 22, 23, 24, 25, 30, 20, 21, 22]  # the end matches 3 tokens back at 0-2
    assert hybrid().propose(tokens, 10, GREEDY, None).token_ids == [23, 24, 25, 30]
    # no earlier occurrence and a draft that does not pay (acceptance 0.1 at cost 0.9): an AR step,
    # until `explore_every` such steps have passed and the draft is tried once
    lonely = hybrid(prior_acceptance=0.1, cost_ratio=0.9, explore_every=2)
    sources = []
    for _ in range(3):
        lonely.propose([40, 41, 42], 10, GREEDY, None)
        sources.append(lonely.source)
        lonely.update([40, 41, 42, 43], 0, 0 if lonely.source == "nothing" else 3)
    assert sources == ["nothing", "nothing", "draft model"]
    # a lookup that runs out at the sequence's end, with a draft that pays: the draft continues it
    both = hybrid(prior_acceptance=0.9, cost_ratio=0.1)
    short = [50, 51, 52, 50, 51]  # [50, 51] matched at 0-1; only [52, 50, 51] follows
    proposal = both.propose(short, 10, GREEDY, None).token_ids
    assert both.source == "prompt lookup + draft model" and proposal[:3] == [52, 50, 51]
    own = autoregressive.decode_tokens(DRAFT, short + [52, 50, 51], len(proposal) - 3, GREEDY, None, frozenset())
    assert proposal[3:] == own


@torch.inference_mode()
def test_hybrid_keeps_a_kind_of_match_after_one_early_rejection():
    """Catches the raw mean of a kind's accepted tokens: one rejected lookup (the answer's first
    token matching the chat template) would rank that kind below a draft worth 1.2x for the rest of
    the text, where code keeps matching its prompt."""
    candidates = hybrid(prior_acceptance=0.85, cost_ratio=0.47, k=5)
    assert 1.1 < candidates.draft_speedup(5) < 1.5
    tokens = [20, 21, 22, 23, 24, 25, 30, 20, 21, 22]  # the end matches 3 tokens back at 0-2
    candidates.propose(tokens, 10, GREEDY, None)
    assert candidates.source == "prompt lookup"
    candidates.update(tokens + [99], 0, candidates.looked_up)  # rejected whole
    # one step of 0 and the optimistic step of 3 (the match's length): 1 + 3 / 2 tokens per step
    assert candidates.lookup_gain(3) == pytest.approx(2.5)
    candidates.propose(tokens, 10, GREEDY, None)
    assert candidates.source == "prompt lookup"


def test_a_cost_sized_hybrid_prices_verification_by_the_measured_curve():
    """With T(n): the draft is worth its expected tokens over T(k + 1) / T(1) + k c, a lookup its expected
    tokens over T(n + 1) / T(1) (here at its kind's prior, 0.8 a position). Catches the curve ignored
    (verifying taken as free) on either side, the draft's cost read off a table that stops at the lookup's
    longest proposal, and a lookup cut by cost extended by the draft as if its match had run out."""
    curve = {1: 1.0, 2: 1.2, 4: 1.6, 6: 2.5, 9: 4.0, 11: 5.0}
    free, priced = hybrid(prior_acceptance=0.6, cost_ratio=0.1), hybrid(prior_acceptance=0.6, cost_ratio=0.1,
                                                                        relative_target=curve)
    alpha = priced.draft_acceptance()
    assert priced.draft_speedup(3) == pytest.approx((1 + alpha + alpha ** 2 + alpha ** 3) / (1.6 + 0.3))
    assert free.draft_speedup(3) == pytest.approx((1 + alpha + alpha ** 2 + alpha ** 3) / 1.3)
    # a draft grown past the lookup's longest proposal (2 x 4 tokens) is priced by the curve there too
    assert priced.draft_speedup(9) == pytest.approx(sum(alpha ** i for i in range(10)) / (4.5 + 0.9))
    priced.propose(LONG_MATCH, 20, GREEDY, None)
    # of the 4 looked-up tokens, 3: 2.95 / T(4) = 1.84 beats 2.44 / T(3) = 1.74 and 3.36 / T(5) = 1.64
    assert priced.source == "prompt lookup" and priced.looked_up == 3
    assert priced.lookup_gain(3) == pytest.approx((1 + 0.8 + 0.64 + 0.512) / 1.6)
    # the match (6 tokens) is followed by 3 before the sequence's end, and the cut keeps 2 of them: the draft
    # (worth 1.95 / 1.5 = 1.3 at its best length here, k = 1) must not continue a lookup cut short by cost as if
    # its match had run out
    periodic = [7, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    steep = hybrid(prior_acceptance=0.95, cost_ratio=0.5, relative_target={1: 1.0, 2: 1.0, 3: 1.3, 4: 2.0, 9: 4.0})
    steep.propose(periodic, 20, GREEDY, None)
    assert steep.source == "prompt lookup" and steep.looked_up == 2


def test_a_cost_sized_hybrid_drafts_the_length_its_verify_cost_pays_for():
    """On a curve with a step past 4 tokens (T(5) = 2.5 T(1)), a draft of adaptive k = 5 is worth most at k = 3
    (3.44 / 1.45 = 2.37 against 4.10 / 2.9 = 1.41 at k = 4): the hybrid proposes at most 3 drafted tokens a step,
    stays lossless, and on a flat curve drafts its whole k. Catches the draft priced at its adaptive k only (then
    here it would be worth less, and on a steeper step nothing) and a length chosen but not proposed."""
    step = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 2.5, 6: 2.6, 8: 3.0}
    no_match = list(range(40, 52))  # nothing repeats: the hybrid's proposals are the draft's
    expected = autoregressive.generate(TARGET, no_match, 24, stop_ids=[]).tokens
    for curve, longest in ((step, 3), ({1: 1.0, 8: 1.0}, 5)):
        # no confidence stop: the draft proposes as many tokens as it is asked for
        candidates = hybrid(k=5, prior_acceptance=0.9, cost_ratio=0.1, relative_target=curve, confidence_threshold=0.0)
        assert candidates.draft_length(5) == longest
        result = speculative.generate(TARGET, candidates, no_match, 24, stop_ids=[])
        assert result.tokens == expected
        drafted = [n for source, n in zip(candidates.sources, result.proposed_per_step) if source == "draft model"]
        assert drafted[0] == longest, (curve, drafted)  # the first draft step, at the adaptive k of 5
        if curve is step:  # the adaptive k may grow past 5, the proposal not past 3
            assert max(drafted) == 3, drafted


def test_hybrid_rolls_the_draft_back_after_lookup_and_draft_proposals():
    """Catches a draft cache left holding rejected looked-up or drafted tokens: every draft
    proposal must be the draft's own greedy continuation of the sequence it was handed."""
    candidates = hybrid(prior_acceptance=0.9, cost_ratio=0.1)
    candidates.draft = RecordingDraft(DRAFT, 3, "heuristic", 0.4)
    repetitive = PROMPT + [3, 4] + PROMPT[1:] + [12, 13] + PROMPT[2:5]
    result = speculative.generate(TARGET, candidates, repetitive, 40, stop_ids=[])
    assert result.tokens == autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
    assert "prompt lookup + draft model" in candidates.sources
    assert sum(a < p for a, p in zip(result.accepted_per_step, result.proposed_per_step)) >= 3
    for tokens, proposal in candidates.draft.proposals:
        with torch.inference_mode():
            own = autoregressive.decode_tokens(DRAFT, tokens, len(proposal), GREEDY, None, frozenset())
        assert proposal == own[:len(proposal)]


def test_hybrid_charges_the_drafts_prefill_against_the_tokens_left():
    """A long prompt with few tokens to generate: at a prefill of 0.5 target steps a token, reading the
    prompt costs the draft more than drafting can save, so the hybrid never drafts (nor explores); at
    0 it drafts. Catches the catch-up left uncharged and an explored draft that pays the prefill."""
    long_prompt = PROMPT + [20 + i % 40 for i in range(60)]
    free = hybrid(prior_acceptance=0.9, cost_ratio=0.1, explore_every=2)
    charged = hybrid(prior_acceptance=0.9, cost_ratio=0.1, explore_every=2, prefill_cost_ratio=0.5)
    expected = autoregressive.generate(TARGET, long_prompt, 12, stop_ids=[]).tokens
    for candidates in (free, charged):
        assert speculative.generate(TARGET, candidates, long_prompt, 12, stop_ids=[]).tokens == expected
    assert "draft model" in free.sources and not any("draft" in source for source in charged.sources)


def test_a_model_free_proposal_wins_against_a_draft_that_must_first_read_the_prompt():
    """The draft's speedup is weighed net of its catch-up, spread over the tokens left: a model-free proposal worth
    more than that, though less than the draft's speedup once caught up, is taken; with no prefill to pay, the draft
    is. Catches the catch-up charged only in whether drafting pays at all, not against the other source (on 02's
    code prompts the draft's prefill of the prompt bought the 3 tokens of a code block's opening, and the suffix
    trees copied the rest a step later)."""
    long_prompt = PROMPT + [20 + i % 40 for i in range(60)]
    left = 12
    charged = hybrid(prior_acceptance=0.9, cost_ratio=0.1, prefill_cost_ratio=0.05)
    charged.reset(vocab_size=None)
    speedup = charged.draft_speedup(charged.draft_length(min(charged.draft.length.k, left - 1)))
    net = charged.net_draft_speedup(long_prompt, left, speedup)
    assert net == pytest.approx(left / (left / speedup + 0.05 * (len(long_prompt) - 2))) and 1 < net < speedup - 0.5
    chosen = []
    for candidates in (charged, hybrid(prior_acceptance=0.9, cost_ratio=0.1)):
        candidates.reset(vocab_size=None)
        candidates.model_free = lambda *args: (Candidates([7, 8]), (net + speedup) / 2, SUFFIX)
        with torch.inference_mode():
            candidates.propose(long_prompt, left - 1, GREEDY, None)
        chosen += candidates.sources
    assert chosen == ["suffix decoding", "draft model"]


def test_the_draft_does_not_open_a_request_whose_prompt_costs_it_more_than_a_step_to_read():
    """Reading a 67-token prompt at 0.02 target steps a token (1.3 steps) is worth it over the 24 tokens to come, but
    not before the answer's first token: the first step is a plain one, the draft drafts from the second on, and the
    output is AR's. A 7-token prompt (0.1 steps) is opened by the draft. Catches the opening left to the draft
    whatever its read costs (on 02's code prompts that read bought 3-6 tokens the suffix trees copied a step later),
    every opening taken from the draft, and a deferral that outlives the opening."""
    long_prompt = PROMPT + [20 + i % 40 for i in range(60)]
    assert 0.02 * (len(long_prompt) - 2) > OPENING_CATCH_UP_LIMIT > 0.02 * (len(PROMPT) - 2)
    for prompt, first in ((long_prompt, "nothing"), (PROMPT, "draft model")):
        candidates = hybrid(prior_acceptance=0.9, cost_ratio=0.1, prefill_cost_ratio=0.02)
        candidates.model_free = lambda *args: (Candidates([]), 0.0, PROMPT_LOOKUP)  # the draft or nothing
        result = speculative.generate(TARGET, candidates, prompt, 24, stop_ids=[])
        assert result.tokens == autoregressive.generate(TARGET, prompt, 24, stop_ids=[]).tokens
        assert candidates.sources[:2] == [first, "draft model"], candidates.sources


def suffix_hybrid(draft=DRAFT, history=None, **kwargs):
    """The hybrid with our suffix tree (8 nodes, vLLM's rules but factor 4) in prompt lookup's place."""
    settings = SuffixSettings(spec_factor=4.0)
    return hybrid(draft, suffix=SuffixCandidates(8, True, settings, history or SuffixTrie(settings.max_depth)),
                  **kwargs)


class SuffixReadsEveryToken(HybridCandidates):
    """After every step, the suffix trees hold the whole sequence, whoever proposed."""

    def update(self, tokens, num_accepted, num_proposed):
        super().update(tokens, num_accepted, num_proposed)
        assert self.suffix.read == len(tokens), (self.suffix.read, len(tokens))


def test_a_hybrid_with_suffix_decoding_is_lossless_and_uses_every_source():
    """Suffix decoding in prompt lookup's place: still AR's tokens, its trees verified, the draft between them.
    Catches a suffix tree proposed as a chain (a sibling taken for a child), and trees that read only the
    tokens of the steps they proposed (later matches then miss what the draft or a plain step added)."""
    repetitive = PROMPT + [3, 4] + PROMPT[1:] + [12, 13]
    expected = autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
    settings = SuffixSettings(spec_factor=4.0)
    for draft in (DRAFT, TARGET):
        candidates = SuffixReadsEveryToken(draft, k=3, prompt_lookup_k=4, prior_acceptance=0.9, cost_ratio=0.2,
                                           suffix=SuffixCandidates(8, True, settings, SuffixTrie(settings.max_depth)))
        result = speculative.generate(TARGET, candidates, repetitive, 40, stop_ids=[])
        assert result.tokens == expected
    assert {"suffix decoding", "draft model"} <= set(candidates.sources)
    assert "prompt lookup" not in candidates.sources


@torch.inference_mode()
def test_a_hybrid_with_suffix_decoding_proposes_from_an_earlier_answer():
    """The end of the sequence occurs only in an answer given before, to another prompt: prompt lookup has nothing,
    the suffix tree proposes what followed there. Catches the hybrid's suffix source without the method's history."""
    settings = SuffixSettings(spec_factor=4.0)
    history = SuffixTrie(settings.max_depth)
    history.extend("an earlier prompt", [60, 61, 62, 63, 64, 65])
    candidates = suffix_hybrid(history=history, prior_acceptance=0.1, cost_ratio=0.9)
    proposal = candidates.propose([40, 41, 60, 61], 10, GREEDY, None)
    assert candidates.source == "suffix decoding"
    assert proposal.token_ids[:4] == [62, 63, 64, 65] and proposal.origins == ["suffix decoding"] * len(proposal.token_ids)
    assert hybrid(prior_acceptance=0.1, cost_ratio=0.9).propose([40, 41, 60, 61], 10, GREEDY, None).token_ids == []


def test_a_cost_sized_hybrid_prices_a_suffix_proposal_by_its_nodes_probabilities():
    """Worth 1 + the proposal's expected accepted tokens over T(n + 1) / T(1): catches the curve ignored, and the
    gain read off prompt lookup's record when the suffix tree proposed."""
    curve = {1: 1.0, 2: 1.2, 4: 1.6, 6: 2.5, 9: 4.0, 11: 5.0}
    settings = SuffixSettings(spec_factor=4.0)
    candidates = hybrid(prior_acceptance=0.1, cost_ratio=0.9, relative_target=curve,
                        suffix=SuffixCandidates(8, True, settings, SuffixTrie(settings.max_depth), curve))
    with torch.inference_mode():
        proposal = candidates.propose(LONG_MATCH, 20, GREEDY, None)
    n = len(proposal.token_ids)
    assert candidates.source == "suffix decoding" and n == candidates.looked_up > 0
    assert candidates.suffix.expected > 0
    expected_gain = (1 + candidates.suffix.expected) / cost_model.cost_at(cost_model.verify_costs(curve, max(curve)), n + 1)
    assert candidates.suffix_gain(n) == pytest.approx(expected_gain)


STEEP = {1: 1.0, 2: 1.3, 4: 1.6, 9: 3.0}  # T(n) / T(1): a tree's nodes are not free


def rejected_rounds(candidates, count=10, match_length=2, sequence=None):
    """`count` steps at whose end the text matches `match_length` tokens of an earlier run whose continuation the
    trees give probability 1, and the target rejects whatever was proposed: the sources the hybrid chose. Given
    `sequence` (a list), the rounds extend it."""
    candidates.reset(vocab_size=None)
    sequence = sequence if sequence is not None else []
    sequence += [value for i in range(1, count + 1) for value in range(10 * i, 10 * i + match_length + 1)]
    for i in range(1, count + 1):
        sequence += range(10 * i, 10 * i + match_length)
        candidates.propose(sequence, 8, GREEDY, None)
        sequence.append(7)  # the target's token: never the proposed continuation
        candidates.update(sequence, 0, candidates.looked_up)
    return candidates.sources


def steep_suffix_hybrid(**kwargs):
    """A hybrid whose draft never pays, with our suffix trees (8 nodes, factor 4) cut by STEEP."""
    settings = SuffixSettings(spec_factor=4.0)
    return hybrid(prior_acceptance=0.1, cost_ratio=0.9, explore_every=100, relative_target=STEEP,
                  suffix=SuffixCandidates(8, True, settings, SuffixTrie(settings.max_depth), STEEP), **kwargs)


@torch.inference_mode()
def test_a_hybrid_stops_proposing_suffix_trees_the_target_keeps_rejecting():
    """The hybrid scales the trees' probabilities by the share of their expected tokens accepted, and within a few
    rejected rounds a plain step is worth more. Catches a trust that never learns (the trees' counts taken as
    probabilities: on chat they kept proposing 13 rejected trees in 32 tokens)."""
    sources = rejected_rounds(steep_suffix_hybrid())
    assert sources[0] == "suffix decoding" and set(sources[-4:]) == {"nothing"}, sources
    credulous = steep_suffix_hybrid()
    credulous.suffix_trust = lambda match_length: 1.0
    assert set(rejected_rounds(credulous)) == {"suffix decoding"}


@torch.inference_mode()
def test_a_hybrid_starts_a_request_from_the_trees_record_over_the_earlier_ones():
    """A method builds a new source for every call and hands each the same `SuffixTrackRecord`: after a request in
    which the target rejected every tree, the next request starts sceptical and takes a plain step where a source
    with a fresh record proposes the tree at face value. Catches a record that `update` never writes, and a
    request that starts from full trust again (in the twelfth session's run, each math and chat request's first
    step went to a 16-node tree the target rejected)."""
    record = SuffixTrackRecord()
    rejected_rounds(steep_suffix_hybrid(suffix_record=record))  # their matches: 2 tokens long
    # the first round was the request's opening, a kind of its own
    assert sum(record.accepted.values()) == 0 and record.expected[2] > 4 and set(record.expected) == {SUFFIX_OPENING, 2}, record
    following = steep_suffix_hybrid(suffix_record=record)
    following.reset(vocab_size=None)
    following.opening = False  # the trust in its matches past the opening
    prior_tokens = HybridSettings.suffix_prior_tokens
    assert following.suffix_trust(2) == pytest.approx(record.trust(2, prior_tokens)) and record.trust(2, prior_tokens) < 0.35
    fresh = steep_suffix_hybrid()
    for candidates in (following, fresh):
        candidates.propose([1, 2, 3, 4, 5, 6, 7, 8, 9], 8, GREEDY, None)  # the opening: nothing matches
        candidates.update([1, 2, 3, 4, 5, 6, 7, 8, 9, 1], 0, 0)
        candidates.propose([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], 8, GREEDY, None)  # a two-token match
    assert (following.sources, fresh.sources) == (["nothing"] * 2, ["nothing", "suffix decoding"])
    # given none, a source keeps its own record over its own requests
    alone = steep_suffix_hybrid()
    rejected_rounds(alone)
    alone.reset(vocab_size=None)
    alone.opening = False
    assert alone.suffix_trust(2) == pytest.approx(alone.suffix_record.trust(2, prior_tokens)) and alone.suffix_trust(2) < 0.35


@torch.inference_mode()
def test_rejected_one_token_matches_leave_the_trust_in_long_matches_whole():
    """The trust is kept by kind of match: after the target rejected the continuations of ten one-token matches, a
    match of 5 tokens is still proposed at the trees' counts, in this request and in the next one. Catches one trust
    for every match (on 02's code prompts, the "\n" that ends the chat template matched an earlier answer's code
    block, the target rejected it, and the hybrid handed the answer, which then copies the prompt, to the draft),
    and a proposal's kind taken from its match length wrongly."""
    record = SuffixTrackRecord()
    candidates = steep_suffix_hybrid(suffix_record=record)
    sequence = [90, 91, 92, 93, 94, 95]
    rejected_rounds(candidates, match_length=1, sequence=sequence)
    sources = list(candidates.sources)
    assert sources[0] == "suffix decoding" and sources[-1] == "nothing" and set(record.expected) == {SUFFIX_OPENING, 1}, (
        sources, record)
    assert candidates.suffix_trust(1) < 0.35 and candidates.suffix_trust(5) == 1.0
    sequence += [90, 91, 92, 93, 94]
    candidates.propose(sequence, 8, GREEDY, None)
    assert candidates.sources[-1] == "suffix decoding" and candidates.suffix.proposed.match_length == 5
    assert candidates.suffix.expected == pytest.approx(candidates.suffix.proposed.counted_score) and candidates.suffix.expected > 0
    following = steep_suffix_hybrid(suffix_record=record)
    following.reset(vocab_size=None)
    following.opening = False  # the trust in its matches past the opening
    assert following.suffix_trust(1) < 0.35 and following.suffix_trust(4) == following.suffix_trust(24) == 1.0


@torch.inference_mode()
def test_a_request_opens_with_the_trees_only_as_far_as_earlier_openings_were_accepted():
    """A request's first proposal is a kind of its own: once the target rejected one request's opening tree, the next
    request opens without it, while a one-token match later in a request is still proposed at the trees' counts.
    Catches the opening filed under its match's kind (a chat prompt's last token, the template's newline, matches
    what followed any newline: in 02's runs 6-8 every opening tree was rejected, and each cost a target forward), and
    an opening that is never recognised."""
    record = SuffixTrackRecord()
    prompt = [30, 31, 32, 33, 40, 41, 30]  # ends in a one-token match, continued by 31, 32, 33
    first = steep_suffix_hybrid(suffix_record=record)
    first.reset(vocab_size=None)
    first.propose(prompt, 8, GREEDY, None)
    assert first.sources == ["suffix decoding"] and first.suffix.proposed.match_length == 1
    first.update(prompt + [7], 0, first.looked_up)  # the target rejects the opening tree
    assert record.expected[SUFFIX_OPENING] > 0 and record.expected[1] == 0 and sum(record.accepted.values()) == 0, record
    later = prompt + [7, 40]  # a one-token match within the request (40, continued by 41, 30, ...)
    first.propose(later, 8, GREEDY, None)
    assert first.sources[-1] == "suffix decoding" and first.suffix.proposed.match_length == 1
    following, fresh = steep_suffix_hybrid(suffix_record=record), steep_suffix_hybrid()
    for candidates in (following, fresh):
        candidates.reset(vocab_size=None)
        candidates.propose(prompt, 8, GREEDY, None)
    assert (following.sources, fresh.sources) == (["nothing"], ["suffix decoding"])


@torch.inference_mode()
def test_a_heavier_suffix_prior_keeps_proposing_trees_through_early_rejections():
    """`suffix_prior_tokens` weighs the trees' prior trust against what the request measured: at the default (2), a
    few rejected trees (the first past the opening cuts the trust from 1 to 0.57) make plain steps worth more; weighed as 32
    tokens, the trees keep proposing through the same 6 rejections (in 02 on the AMX Xeon, one rejected tree at a
    request's first step handed code answers to the draft). Catches the setting not reaching the trust (both would
    behave alike), and the weight applied to the request's own evidence as well (the default would stop as late)."""
    light, heavy = steep_suffix_hybrid(), steep_suffix_hybrid(suffix_prior_tokens=32.0)
    for candidates in (light, heavy):
        rejected_rounds(candidates, count=6)
    assert heavy.suffix_trust(2) > 0.4 > 0.25 > light.suffix_trust(2)
    assert set(light.sources[-3:]) == {"nothing"} and set(heavy.sources) == {"suffix decoding"}, (light.sources,
                                                                                                  heavy.sources)
    with pytest.raises(ValueError, match="suffix_prior_tokens"):
        steep_suffix_hybrid(suffix_prior_tokens=0)


class CheckedHybrid(HybridCandidates):
    """After every step, what the hybrid believes the draft has read equals the draft's cache."""

    def update(self, tokens, num_accepted, num_proposed):
        super().update(tokens, num_accepted, num_proposed)
        assert self.draft_seen == self.draft.cached_length, (self.draft_seen, self.draft.cached_length)


def test_hybrid_knows_what_its_draft_has_read():
    """The catch-up the hybrid charges is what the draft's cache lacks: catches a count that forgets the
    looked-up tokens a draft continued after, or the proposals it kept in its cache."""
    candidates = CheckedHybrid(DRAFT, k=3, prompt_lookup_k=4, prior_acceptance=0.9, cost_ratio=0.1,
                               prefill_cost_ratio=0.01)
    repetitive = PROMPT + [3, 4] + PROMPT[1:] + [12, 13] + PROMPT[2:5]
    result = speculative.generate(TARGET, candidates, repetitive, 40, stop_ids=[])
    assert result.tokens == autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
    assert {"prompt lookup + draft model", "draft model"} <= set(candidates.sources)


TREE = [(-1, 0), (-1, 1), (0, 0), (2, 0)]  # the draft's top child (with a second) and two more under it: depth 3


def test_a_hybrid_drafting_a_tree_equals_ar_and_knows_what_its_draft_has_read():
    """Given the picker's tree, the hybrid's draft proposes that tree: lossless, and its catch-up counts only the
    real tokens (the tree's nodes leave the draft's cache after each proposal). Catches the chain's count kept for a
    tree (the nodes taken as read) and a tree continuing a lookup (a chain's parents on a tree's nodes)."""
    repetitive = PROMPT + [3, 4] + PROMPT[1:] + [12, 13] + PROMPT[2:5]
    for draft in (DRAFT, TARGET):
        candidates = CheckedHybrid(draft, k=3, prompt_lookup_k=4, prior_acceptance=0.9, cost_ratio=0.1,
                                   prefill_cost_ratio=0.01, confidence_threshold=0.0, draft_tree=TREE)
        proposals = []
        propose = candidates.propose
        candidates.propose = lambda *args: proposals.append(propose(*args)) or proposals[-1]
        result = speculative.generate(TARGET, candidates, repetitive, 40, stop_ids=[])
        assert result.tokens == autoregressive.generate(TARGET, repetitive, 40, stop_ids=[]).tokens
        assert isinstance(candidates.draft, DraftTreeCandidates)
        drafted = [proposal for proposal, source in zip(proposals, candidates.sources) if source == "draft model"]
        assert any(proposal.parents == [-1, -1, 0, 2] for proposal in drafted), drafted
        assert "prompt lookup + draft model" not in candidates.sources and "prompt lookup" in candidates.sources


def test_a_hybrid_counts_a_trees_accepted_path_not_its_side_nodes():
    """The target drafting for itself: each tree's main path (3 deep) is accepted whole, so the draft's acceptance
    stays at 1 and no rejection is counted. Catches a tree's side nodes counted as proposed along the path (each
    step would count one rejection, and the hybrid would draft less as the acceptance fell)."""
    candidates = hybrid(TARGET, prior_acceptance=0.5, cost_ratio=0.1, confidence_threshold=0.0, draft_tree=TREE,
                        explore_every=1)
    result = speculative.generate(TARGET, candidates, PROMPT, 24, stop_ids=[])
    assert result.tokens == ar(24)
    drafted_steps = [a for a, source in zip(result.accepted_per_step, candidates.sources) if source == "draft model"]
    assert 3 in drafted_steps, (drafted_steps, candidates.sources)  # (the last steps may be cut by the tokens left)
    assert candidates.draft_proposed == candidates.draft_accepted == sum(drafted_steps)
    assert candidates.draft_acceptance() > 0.5


@pytest.mark.usefixtures("unmeasured")
def test_hybrid_sampling_matches_the_target_distribution():
    """Catches the joined proposal (looked-up tokens, then drafted ones) weighed with the draft's q
    at the wrong rows or without one-hot rows for the looked-up tokens."""
    prompt = [1, 2, 1, 2]  # the end matched at 0-1: the lookup runs out after [1, 2], the draft goes on
    samples = 600
    candidates = HybridCandidates(SMALL_DRAFT, k=2, prompt_lookup_k=4, prior_acceptance=0.9, cost_ratio=0.1)
    worst, late_rejections = worst_tv(candidates, prompt, Sampling(temperature=1.0), samples)
    assert worst < tv_limit(samples), worst
    assert late_rejections >= 20, late_rejections
    assert candidates.sources[0] == "prompt lookup + draft model"


@pytest.mark.usefixtures("unmeasured")
def test_a_hybrid_drafting_a_tree_samples_from_the_target_distribution():
    """The hybrid's draft tree under sampling: its q rows and parents reach the tree sampler as the draft drew them.
    Catches the tree passed on as a chain (a sibling's token judged as its brother's child, under the wrong q)."""
    samples = 600
    candidates = HybridCandidates(SMALL_DRAFT, k=2, prompt_lookup_k=4, prior_acceptance=0.9, cost_ratio=0.1,
                                  confidence_threshold=0.0, draft_tree=TREE)
    worst, late_rejections = worst_tv(candidates, SMALL_PROMPT, Sampling(temperature=1.0), samples)
    assert worst < tv_limit(samples), worst
    assert late_rejections >= 20, late_rejections
    assert "draft model" in candidates.sources


def test_hybrid_joined_proposal_covers_looked_up_ids_beyond_a_narrow_draft_head():
    """A looked-up id the draft's (narrower) head has no column for gets q one-hot on it, not an IndexError."""
    drafted = Candidates([1], torch.full((1, 4), 0.25))
    joined = HybridCandidates._joined([6, 2], drafted, Sampling(temperature=1.0))
    assert joined.token_ids == [6, 2, 1] and tuple(joined.probs.shape) == (3, 7)
    assert joined.probs[0, 6] == 1 and joined.probs[1, 2] == 1 and joined.probs[2, :4].sum() == 1
