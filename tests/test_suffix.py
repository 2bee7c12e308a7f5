"""Suffix decoding (decoders.suffix): the suffix tree counts every substring, forgets a removed sequence
completely, proposes what arctic-inference's C++ tree proposes, and decoding with it (ours or arctic's)
equals AR; a prompt run again never reads its own earlier answer, another prompt does."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tiny import PROMPT, tiny_llama
from specdec_lab.decoders import autoregressive, speculative
from specdec_lab.cost_model import nodes_worth_verifying
from specdec_lab.decoders.suffix import (ArcticSuffixCandidates, SuffixCandidates, SuffixTrie, Speculation,
                                         arctic_available, arctic_cache, merged)
from specdec_lab.decoders.trees import tree_problem
from specdec_lab.experiments import lineups
from specdec_lab.method import HybridSettings, SuffixSettings
from specdec_lab.models import LoadedModel
from specdec_lab.sampling import GREEDY

needs_arctic = pytest.mark.skipif(not arctic_available(),
                                  reason="arctic-inference's suffix tree is not built: `make arctic` (CI builds it)")


def counts(trie: SuffixTrie) -> Counter:
    """Every substring in the trie with its count (nodes with none left must be gone)."""
    found, stack = Counter(), [((), trie.root)]
    while stack:
        string, node = stack.pop()
        for token, child in node.children.items():
            assert child.count > 0, f"a node with no occurrence left: {string + (token,)}"
            found[string + (token,)] = child.count
            stack.append((string + (token,), child))
    return found


def substrings(sequences, max_depth: int) -> Counter:
    return Counter(tuple(text[start:end]) for text in sequences for start in range(len(text))
                   for end in range(start + 1, min(len(text), start + max_depth) + 1))


def test_the_trie_counts_every_substring_and_forgets_a_removed_sequence_completely():
    rng = random.Random(0)
    sequences = {name: [rng.randrange(4) for _ in range(rng.randrange(5, 40))] for name in "abc"}
    trie = SuffixTrie(max_depth=5)
    for name, text in sequences.items():
        cut = rng.randrange(len(text))
        trie.extend(name, text[:cut])  # grown in two pieces, as a generation grows
        trie.extend(name, text[cut:])
    assert counts(trie) == substrings(sequences.values(), 5)
    assert trie.root.count == sum(map(len, sequences.values()))
    trie.remove("b")
    assert counts(trie) == substrings([sequences["a"], sequences["c"]], 5)
    trie.extend("b", [1, 2])  # a removed sequence starts again from nothing
    assert counts(trie) == substrings([sequences["a"], sequences["c"], [1, 2]], 5)


def test_a_path_proposes_the_most_frequent_continuation_within_the_match_length_budget():
    trie = SuffixTrie(max_depth=8)
    trie.extend(0, [1, 2, 3, 4, 9, 1, 2, 3, 4, 9, 1, 2, 3, 5])
    # "2 3" occurs 3 times: followed by 4 twice, by 5 once; the budget is the match length (factor 1)
    found = trie.speculate([7, 1, 2, 3], max_tokens=8, tree=False, min_token_prob=0.0)
    assert found.match_length == 3 and found.token_ids == [4, 9, 1]
    assert found.probs == pytest.approx([2 / 3, 2 / 3, 2 / 3])
    tree = trie.speculate([7, 1, 2, 3], max_tokens=8, spec_factor=2.0, tree=True, min_token_prob=0.0)
    assert tree.token_ids[:3] == [4, 9, 1]  # the most probable nodes first
    assert tree.parents[tree.token_ids.index(5)] == -1  # then the rarer sibling of the first
    assert tree.score >= found.score


def test_min_token_prob_cuts_unlikely_continuations():
    trie = SuffixTrie(max_depth=8)
    trie.extend(0, [1, 2, 1, 3, 1, 4, 1, 5, 1])
    assert trie.speculate([0, 1], 4, 1.0, 0.0, min_token_prob=0.3, tree=True).token_ids == []
    assert len(trie.speculate([0, 1], 4, 1.0, 0.0, min_token_prob=0.2, tree=True).token_ids) == 1


@needs_arctic
def test_our_suffix_tree_proposes_what_arctic_inference_proposes():
    """The same proposal (score and length) as arctic-inference's C++ tree on random texts, paths and trees;
    it breaks a few ties between equally frequent continuations otherwise."""
    rng = random.Random(1)
    same, trials = 0, 0
    for _ in range(600):
        depth, vocab = rng.choice([3, 8, 24]), rng.choice([3, 6, 20])
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(2, 80))]
        context = (prompt + [rng.randrange(vocab) for _ in range(rng.randrange(0, 10))])[-depth:]
        cache = arctic_cache(depth)
        cache.start_request("r", prompt)
        ours = SuffixTrie(depth)
        ours.extend(0, prompt)
        for tree in (False, True):
            rules = dict(max_tokens=rng.randrange(1, 12), spec_factor=rng.choice([0.5, 1.0, 2.0]),
                         min_token_prob=rng.choice([0.0, 0.1, 0.3]))
            theirs = cache.speculate("r", context, max_spec_tokens=rules["max_tokens"],
                                     max_spec_factor=rules["spec_factor"], min_token_prob=rules["min_token_prob"],
                                     use_tree_spec=tree)
            found = ours.speculate(context, tree=tree, **rules)
            trials += 1
            same += abs(theirs.score - found.score) < 1e-4 and len(theirs.token_ids) == len(found.token_ids)
    assert same >= 0.99 * trials, f"{same} of {trials} proposals alike"


def test_merged_proposals_hold_the_higher_score_one_whole_then_the_others_most_probable_nodes():
    own = Speculation([5, 6, 7], [-1, 0, 1], [0.9, 0.6, 0.3])  # score 1.8
    earlier = Speculation([5, 8, 9, 4], [-1, 0, -1, 2], [1.0, 0.9, 0.2, 0.2])  # score 2.3: placed whole first
    everything = merged(own, earlier, budget=10)
    assert everything.token_ids == [5, 8, 9, 4, 6, 7] and everything.parents == [-1, 0, -1, 2, 0, 4]
    cut = merged(own, earlier, budget=5)  # room for one more: own's 6 (0.6) before its child 7
    assert cut.token_ids == [5, 8, 9, 4, 6] and cut.parents == [-1, 0, -1, 2, 0]
    assert merged(own, Speculation(), budget=2).token_ids == [5, 6]
    assert tree_problem(cut.token_ids, cut.parents) is None


def ar(model, prompt=PROMPT, max_new_tokens=60):
    return autoregressive.generate(model, prompt, max_new_tokens, stop_ids=[]).tokens


SMALL = dict(vocab_size=16, hidden=32, weight_std=0.3, eos_token_id=None)  # a model that repeats itself


def make_ours(tree, history=None):
    return SuffixCandidates(k=8, tree=tree, settings=SuffixSettings(max_depth=8), history=history)


def make_arctic(tree, cache=None):
    return ArcticSuffixCandidates(cache or arctic_cache(8), k=8, tree=tree, settings=SuffixSettings(max_depth=8))


@pytest.mark.parametrize("make", [make_ours, pytest.param(make_arctic, marks=needs_arctic)], ids=["ours", "arctic"])
@pytest.mark.parametrize("tree", [True, False], ids=["tree", "path"])
def test_suffix_decoding_equals_ar_and_accepts_what_the_text_repeats(make, tree):
    model = tiny_llama(0, **SMALL)
    result = speculative.generate(model, make(tree), PROMPT, 60, GREEDY, stop_ids=[])
    assert result.tokens == ar(model)
    assert sum(result.accepted_per_step) >= 20  # its own generated text, read as it grows


def test_a_prompt_run_again_does_not_read_its_own_earlier_answer_and_another_prompt_does():
    model = tiny_llama(0, **SMALL)
    history = SuffixTrie(8)
    first = speculative.generate(model, make_ours(True, history), PROMPT, 30, stop_ids=[])
    again = speculative.generate(model, make_ours(True, history), PROMPT, 30, stop_ids=[])
    assert again.accepted_per_step == first.accepted_per_step  # its earlier answer was dropped first
    assert len(history.sequences) == 1  # one answer per prompt
    # another prompt whose answer is the rest of the first one's (greedy continues the same text): it reads
    # that answer from the history
    other = [*PROMPT, *first.tokens[:4]]
    alone = speculative.generate(model, make_ours(True), other, 26, stop_ids=[])
    helped = speculative.generate(model, make_ours(True, history), other, 26, stop_ids=[])
    assert helped.tokens == alone.tokens == first.tokens[4:]
    assert sum(helped.accepted_per_step) > sum(alone.accepted_per_step)
    assert len(history.sequences) == 2


def test_the_requests_own_tree_holds_its_prompt_and_answer_as_one_text():
    """A match that spans the prompt's end and the answer's start is found only in the request's own tree
    (the history holds the answer alone): catches an answer never added to it, or added as another text."""
    source = make_ours(True)
    prompt = [1, 2, 3, 4, 5]
    source.propose(prompt, 8, GREEDY, None)
    source.update(prompt + [6, 7, 8, 4, 5], 3, 3)  # the answer so far: 6 7 8, then the prompt's end again
    assert source.local.find([5, 6, 7]) is not None and source.history.find([5, 6, 7]) is None
    proposal = source.propose(prompt + [6, 7, 8, 4, 5], 8, GREEDY, None)
    assert proposal.token_ids == [6, 7]  # what followed "4 5" across the boundary, as long as the match


def test_the_nodes_worth_verifying_maximise_expected_tokens_per_unit_of_the_forwards_cost():
    """(1 + the kept nodes' probabilities) / (T(n + 1) / T(1)): the target's own token counted, the forward
    over the last token and n nodes costed. Catches the bonus token left out and T(n) read one off."""
    steep_after_two = {1: 1.0, 2: 1.0, 3: 3.0}  # a second node makes the forward 3x a step
    assert nodes_worth_verifying([0.9, 0.8], steep_after_two) == 1  # 1.9 / 1.0 against 2.7 / 3.0
    assert nodes_worth_verifying([0.9, 0.8, 0.5], {1: 1.0, 16: 1.0}) == 3  # flat: every node is free
    assert nodes_worth_verifying([0.3], {1: 1.0, 2: 2.0}) == 0  # 1.3 tokens for 2 steps: a plain step is better
    assert nodes_worth_verifying([], {1: 1.0, 2: 1.1}) == 0
    # T(n) in milliseconds or relative to T(1): the same choice
    assert nodes_worth_verifying([0.9, 0.8], {n: 40.0 * t for n, t in steep_after_two.items()}) == 1


def cost_sized(relative_target, make=None):
    settings = SuffixSettings(max_depth=8)
    return (make or SuffixCandidates)(k=8, tree=True, settings=settings, relative_target=relative_target)


@pytest.mark.parametrize("implementation", ["ours", pytest.param("arctic", marks=needs_arctic)])
def test_cost_sized_suffix_proposals_keep_their_most_probable_nodes_and_nothing_where_no_node_pays(implementation):
    def make(**kwargs):
        if implementation == "ours":
            return SuffixCandidates(**kwargs)
        return ArcticSuffixCandidates(arctic_cache(8), **kwargs)

    text = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2]  # "1 2" was followed by 3 every time; "2 3" by 4, 5, 4
    unsized = make(k=8, tree=True, settings=SuffixSettings(max_depth=8)).propose(text, 8, GREEDY, None)
    flat = cost_sized({1: 1.0, 32: 1.0}, make).propose(text, 8, GREEDY, None)
    assert flat.token_ids == unsized.token_ids and flat.parents == unsized.parents and len(flat.token_ids) >= 3
    one = cost_sized({1: 1.0, 2: 1.0, 3: 4.0}, make).propose(text, 8, GREEDY, None)  # one node is free, two cost 4x
    assert one.token_ids == [3] and one.parents == [-1]  # "3" followed "1 2" every time: the most probable node
    steep = {1: 1.0, 2: 2.5, 3: 4.0, 5: 7.0, 9: 15.0}  # every node costs more than a step: none pays
    assert cost_sized(steep, make).propose(text, 8, GREEDY, None).token_ids == []


def test_a_cost_sized_merge_is_no_larger_than_the_larger_sized_proposal():
    """The request's tree proposes 3 after "1 2", the earlier answers 9: one node is worth verifying, so
    the merged tree holds one, not one of each (catches the merge left at the unsized budget)."""
    history = SuffixTrie(8)
    history.extend("earlier", [1, 2, 9, 1, 2, 9, 1, 2, 9])
    source = SuffixCandidates(k=8, tree=True, settings=SuffixSettings(max_depth=8), history=history,
                              relative_target={1: 1.0, 2: 1.0, 3: 4.0})
    proposal = source.propose([1, 2, 3, 7, 1, 2], 8, GREEDY, None)
    assert len(proposal.token_ids) == 1 and proposal.token_ids[0] in (3, 9)


def test_cost_sized_suffix_decoding_equals_ar():
    model = tiny_llama(0, **SMALL)
    result = speculative.generate(model, cost_sized({1: 1.0, 2: 1.05, 4: 1.3, 9: 3.0}), PROMPT, 60, GREEDY, stop_ids=[])
    assert result.tokens == ar(model)
    assert max(result.proposed_per_step) <= 7  # 8 nodes would cost 3x a step; never worth it here


@pytest.mark.parametrize("make, problem", [
    (lambda: SuffixCandidates(relative_target={}), "needs the target's measured T"),
    (lambda: SuffixSettings(max_depth=1), "max_depth must be an integer >= 2, got 1"),
    (lambda: SuffixSettings(min_token_prob=1.5), "min_token_prob must be in"),
    (lambda: SuffixCandidates(k=0), "k .* must be an integer >= 1, got 0"),
    (lambda: SuffixCandidates(history=SuffixTrie(5)), "5 deep, the settings say 24"),
])
def test_bad_suffix_settings_are_refused(make, problem):
    with pytest.raises(ValueError, match=problem):
        make()


def test_the_line_ups_hybrid_keeps_its_earlier_answers_from_call_to_call():
    """The hybrid with suffix decoding in prompt lookup's place, as the line-up builds it: a prompt that continues
    the answer of an earlier call has that answer proposed. Catches a method that builds a new history for every
    call (the suffix trees would then hold the request alone)."""
    model = tiny_llama(0, **SMALL)
    target = LoadedModel("tiny", model, None, None)
    draft = LoadedModel("tiny draft", tiny_llama(1, layers=1), None, None)

    def method():  # a draft too slow to ever pay: every proposal is the suffix trees'
        return lineups.hybrid(target, draft, 3, 4, 26, cost_ratio=0.99, settings=HybridSettings(0.1, False),
                              suffix_k=8, suffix=SuffixSettings(max_depth=8, spec_factor=4.0))
    reused = method()
    first = reused.decode(PROMPT)
    other = [*PROMPT, *first.tokens[:4]]
    alone, helped = method().decode(other), reused.decode(other)
    assert helped.tokens == alone.tokens == autoregressive.generate(model, other, 26).tokens
    assert sum(helped.accepted_per_step) > sum(alone.accepted_per_step)
    assert reused.source.suffix == SuffixSettings(max_depth=8, spec_factor=4.0) and reused.source.kind == "hybrid"


def test_the_line_ups_and_the_pickers_hybrid_carry_one_trees_record_from_call_to_call(monkeypatch):
    """Every call of the line-up's hybrid, and every calibration prompt the picker replays it on, builds a new
    source over one `SuffixTrackRecord`, so a request starts from the trees' acceptance over the earlier ones, and
    the picker predicts what the line-up runs. Catches a record built per call (each request would take the trees at
    face value again), a picker that carries none while the line-up does, and the settings' weight of the trees'
    prior left behind by either."""
    from specdec_lab.decoders.candidates import HybridCandidates
    from specdec_lab.experiments import picker

    built = []

    class Recorded(HybridCandidates):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(lineups, "HybridCandidates", Recorded)
    monkeypatch.setattr(picker, "HybridCandidates", Recorded)
    model = tiny_llama(0, **SMALL)
    target = LoadedModel("tiny", model, None, None)
    draft = LoadedModel("tiny draft", tiny_llama(1, layers=1), None, None)
    settings = HybridSettings(0.1, False, suffix_prior_tokens=32.0)
    method = lineups.hybrid(target, draft, 3, 4, 12, cost_ratio=0.99, settings=settings,
                            suffix_k=8, suffix=SuffixSettings(max_depth=8, spec_factor=4.0))
    method.decode(PROMPT)
    method.decode([*PROMPT, 3])
    candidate = picker.hybrid_candidate(3, 4, 0.99, settings, suffix_k=8,
                                        suffix=SuffixSettings(max_depth=8, spec_factor=4.0))
    candidate.make(None), candidate.make(None)
    line_up, replayed = built[:2], built[2:]
    assert line_up[0] is not line_up[1] and line_up[0].suffix_record is line_up[1].suffix_record
    assert replayed[0] is not replayed[1] and replayed[0].suffix_record is replayed[1].suffix_record
    assert line_up[0].suffix_record is not replayed[0].suffix_record
    # and both weigh the trees' prior as the picker's settings say
    assert {source.suffix_prior_tokens for source in built} == {32.0}
