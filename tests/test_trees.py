"""Token trees (decoders.trees and the tree candidate sources), on both engines: the mask shows each
node its ancestors only, the cache keeps the accepted path only, and greedy decoding with any tree
equals AR token for token. The tree sampler's distribution is checked in test_speculative.py, next
to the chain's."""

from __future__ import annotations

import pytest
import torch

from tiny import PROMPT, on_llama_cpp, tiny_llama
from specdec_lab.decoders import autoregressive, speculative
from specdec_lab.decoders.backend import open_sequence, vocab_size
from specdec_lab.decoders.candidates import (Candidates, DraftModelCandidates, DraftTreeCandidates, PromptLookupCandidates,
                                             PromptLookupTreeCandidates, longest_matches)
from specdec_lab.decoders.trees import accept_tree_greedy, tree_mask, tree_problem, verify_tree
from specdec_lab.models import llama_cpp
from specdec_lab.sampling import GREEDY

needs_llama_cpp = pytest.mark.skipif(not llama_cpp.available(),
                                     reason="llama-cpp-python is not installed: `make llama-cpp` (CI installs it)")
ENGINES = ["transformers", pytest.param("llama.cpp", marks=needs_llama_cpp)]
MODELS = {
    "target": lambda: tiny_llama(seed=0),
    "draft": lambda: tiny_llama(seed=1, layers=1),
    "small": lambda: tiny_llama(0, vocab_size=16, hidden=32, weight_std=0.3, eos_token_id=None),  # repeats itself
    "peaked": lambda: tiny_llama(2, weight_std=0.3),  # confident logits: what a node sees shows in its argmax
    "peaked again": lambda: tiny_llama(2, weight_std=0.3),  # the same weights, loaded apart (one llama.cpp cache)
}


@pytest.fixture(scope="module", params=ENGINES)
def on(request, tmp_path_factory):
    """on(name): the model called `name` on this module's engine."""
    models = {name: make() for name, make in MODELS.items()}
    if request.param == "llama.cpp":
        models = {name: on_llama_cpp(model, tmp_path_factory.mktemp(name)) for name, model in models.items()}
    return lambda name: models[name]


def ar(model, prompt=PROMPT, max_new_tokens=40):
    return autoregressive.generate(model, prompt, max_new_tokens, stop_ids=[]).tokens


# --- the tree's geometry ---------------------------------------------------------------------------------

def test_each_node_sees_the_inputs_and_its_ancestors_only():
    """Two cached tokens, two inputs, then the tree  root -> a -> c,  root -> b -> d, b -> e."""
    parents = [-1, -1, 0, 1, 1]  # a, b, c (under a), d (under b), e (under b)
    visible = tree_mask(cached=2, inputs=2, parents=parents).int().tolist()
    #            cache  inputs  a  b  c  d  e
    assert visible == [[1, 1, 1, 0, 0, 0, 0, 0, 0],   # input 0
                       [1, 1, 1, 1, 0, 0, 0, 0, 0],   # input 1: the current token
                       [1, 1, 1, 1, 1, 0, 0, 0, 0],   # a
                       [1, 1, 1, 1, 0, 1, 0, 0, 0],   # b: not its sibling a
                       [1, 1, 1, 1, 1, 0, 1, 0, 0],   # c: a and itself
                       [1, 1, 1, 1, 0, 1, 0, 1, 0],   # d: b and itself, not its sibling e
                       [1, 1, 1, 1, 0, 1, 0, 0, 1]]   # e


def test_greedy_acceptance_follows_the_argmax_down_the_tree():
    """Row 0 follows the current token, row 1 + i node i. The argmax picks b (the second child), then
    e (b's second child), then a token no child of e holds: the path is b, e and that token is next."""
    token_ids, parents = [10, 11, 12, 13, 14], [-1, -1, 0, 1, 1]
    wanted = {0: 11, 1: 12, 2: 14, 5: 7}  # row -> argmax: root -> 11 (b); a -> 12, in vain; b -> 14 (e); e -> 7
    logits = torch.zeros(6, 100)
    for row, token in wanted.items():
        logits[row, token] = 1.0
    assert accept_tree_greedy(logits, token_ids, parents) == ([1, 4], 7)


@pytest.mark.parametrize("token_ids, parents, problem", [
    ([1, 2], [-1], "2 parents|1 parents"),
    ([1, 2], [-1, 1], "parent 1"),
    ([1, 2], [-1, 3], "parent 3"),
    ([1, 1], [-1, -1], "repeats its sibling"),
])
def test_a_malformed_tree_is_refused_before_any_forward(token_ids, parents, problem):
    assert tree_problem(token_ids, parents) is not None
    with pytest.raises(ValueError, match=problem):
        verify_tree(open_sequence(MODELS["draft"]()), PROMPT, Candidates(token_ids, None, parents), GREEDY, None)


# --- the cache keeps the accepted path, and nothing else ---------------------------------------------------

def oracle_tree(free: list[int], vocab: int) -> tuple[Candidates, list[int]]:
    """A tree after prompt + free[0] whose right answer hides behind decoys: free[1] is the root's
    second child (a decoy first), free[2] the third child of that node, free[3] its only child; the
    decoys have children of their own. Returns the tree and the path the target must accept."""
    decoy = [(token + 1) % vocab for token in free]
    decoy2 = [(token + 2) % vocab for token in free]
    token_ids = [decoy[1], free[1], free[2], decoy[2], decoy2[2], free[2], free[3]]
    parents = [-1, -1, 0, 1, 1, 1, 5]  # a decoy's child holds the right token at the right depth, in vain
    return Candidates(token_ids, None, parents), [1, 5, 6]


def test_the_tree_step_accepts_the_hidden_branch_and_keeps_only_its_cache(on):
    """Catches a node that sees a sibling or a cousin (its logits change: the path breaks), the path
    read from the wrong rows, and a cache that keeps a rejected node or misses an accepted one (the
    next forward's logits differ from a fresh forward over the accepted text)."""
    target = on("target")
    free = ar(target, max_new_tokens=6)
    tokens = PROMPT + free[:1]
    sequence = open_sequence(target)
    autoregressive.prefill(sequence, PROMPT)
    tree, path = oracle_tree(free, vocab_size(target))
    accepted, token = verify_tree(sequence, tokens, tree, GREEDY, None)
    assert (accepted, token) == (path, free[4])
    assert sequence.length == len(tokens) + len(path)
    cached = sequence.forward([token], keep=1)[-1]
    fresh = open_sequence(target).forward(tokens + free[1:4] + [token], keep=1)[-1]
    assert torch.allclose(cached, fresh, atol=1e-4)


class OracleTrees:
    """Proposes oracle_tree after every step (the right answer behind decoys), from AR's text."""

    forwards = 0

    def __init__(self, free):
        self.free = free

    def reset(self, vocab_size):
        self.vocab_size = vocab_size

    def propose(self, tokens, max_candidates, sampling, rng):
        done = len(tokens) - len(PROMPT)
        ahead = self.free[done - 1:done + 3]
        if max_candidates < 3 or len(ahead) < 4:
            return Candidates([])
        return oracle_tree(ahead, self.vocab_size)[0]

    def update(self, tokens, num_accepted, num_proposed):
        pass


def test_decoding_with_trees_whose_answer_hides_behind_decoys_equals_ar(on):
    """Step after step (each one's inputs are the last step's next token), the hidden path of three is
    accepted and the text is AR's: a cache that kept a decoy, or lost a path token, would show."""
    target = on("target")
    free = ar(target, max_new_tokens=41)
    result = speculative.generate(target, OracleTrees(free), PROMPT, 40, stop_ids=[])
    assert result.tokens == free[:40]
    # the first step prefills (the oracle needs one token of the answer); the last ones have no room for a tree
    assert result.accepted_per_step == [0] + [3] * 9 + [0] * 3


# --- the tree sources ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("depth, branching, beam, nodes", [(4, 3, 3, 10), (3, 2, 1, 6), (5, 4, 4, 40)])
def test_draft_trees_equal_ar(on, depth, branching, beam, nodes):
    target, draft = on("target"), on("draft")
    result = speculative.generate(target, DraftTreeCandidates(draft, depth, branching, beam, nodes), PROMPT, 40,
                                  stop_ids=[])
    assert result.tokens == ar(target)
    assert max(result.proposed_per_step) == min(nodes, branching + (depth - 1) * beam * branching)
    # one draft forward per level: `depth` levels a step, fewer near the end (the tree never outgrows what is left)
    generated, levels = 0, 0
    for accepted in result.accepted_per_step:
        levels += min(depth, 40 - generated - 1)
        generated += accepted + 1
    assert result.draft_forwards == levels


@pytest.mark.parametrize("shape", [[(-1, 0), (-1, 1), (0, 0), (0, 1), (2, 0)], [(-1, 1), (-1, 0), (1, 2), (0, 0)]])
def test_fixed_shape_draft_trees_equal_ar_and_fill_each_rank(on, shape):
    """Sequoia's fixed shape: node (parent, rank) holds the parent's rank-th draft token; the ranks of the
    root's children are the draft's own top tokens after the prompt."""
    target, draft = on("target"), on("draft")
    result = speculative.generate(target, DraftTreeCandidates(draft, shape=shape), PROMPT, 40, stop_ids=[])
    assert result.tokens == ar(target)
    tree = DraftTreeCandidates(draft, shape=shape)
    tree.reset(vocab_size(target))
    proposal = tree.propose(list(PROMPT), 10, GREEDY, None)
    ranked = open_sequence(draft).forward(PROMPT, keep=1)[-1].argsort(descending=True).tolist()
    roots = [node for node, (parent, _) in enumerate(shape) if parent < 0]
    assert [proposal.token_ids[node] for node in roots] == [ranked[shape[node][1]] for node in roots]
    assert proposal.parents == [parent for parent, _ in shape]


@pytest.mark.parametrize("threshold", [0.0, 0.25, 0.4])
def test_a_chain_shaped_tree_with_a_confidence_stop_drafts_what_the_adaptive_chain_drafts(on, threshold):
    """A fixed tree the picker sized as a chain, with the chain's confidence stop: the same proposals, steps
    and draft forwards as the chain (a stop read on the wrong level or node, or after the level was grown,
    differs). The target drafts for itself, top probabilities 0.2-0.6: the stop alone sets the depth."""
    target, draft = on("peaked"), on("peaked again")
    shape = [(-1, 0), (0, 0), (1, 0), (2, 0), (3, 0)]
    chain = speculative.generate(target, DraftModelCandidates(draft, 5, "constant", threshold), PROMPT, 40, stop_ids=[])
    tree = speculative.generate(target, DraftTreeCandidates(draft, shape=shape, confidence_threshold=threshold),
                                PROMPT, 40, stop_ids=[])
    assert tree.tokens == chain.tokens == ar(target)
    assert (tree.proposed_per_step, tree.accepted_per_step, tree.draft_forwards) == (
        chain.proposed_per_step, chain.accepted_per_step, chain.draft_forwards)
    if threshold:
        assert len(set(chain.proposed_per_step[:-1])) >= 3  # the stop cut at several depths


def test_a_branching_tree_with_a_confidence_stop_equals_ar_and_drafts_no_deeper_than_its_main_path_allows(on):
    target, draft = on("target"), on("draft")
    shape = [(-1, 0), (-1, 1), (0, 0), (0, 1), (2, 0), (4, 0)]
    stopped = speculative.generate(target, DraftTreeCandidates(draft, shape=shape, confidence_threshold=0.5),
                                   PROMPT, 40, stop_ids=[])
    full = speculative.generate(target, DraftTreeCandidates(draft, shape=shape), PROMPT, 40, stop_ids=[])
    assert stopped.tokens == full.tokens == ar(target)
    assert sum(stopped.proposed_per_step) < sum(full.proposed_per_step)


def test_the_target_as_its_own_draft_tree_accepts_its_whole_top_path(on):
    """Greedy, every node grown (beam 8: all of a level): the draft's top child is the target's argmax at
    every level, so every tree is accepted to its depth; a level fed with the wrong ancestors or
    positions would break the path."""
    target = on("peaked")
    tree = DraftTreeCandidates(on("peaked again"), depth=4, branching=2, beam=8, nodes=30)
    result = speculative.generate(target, tree, PROMPT, 41, stop_ids=[])
    assert result.tokens == ar(target, max_new_tokens=41)
    assert result.accepted_per_step == [4] * 8 + [0]


def test_prompt_lookup_trees_equal_ar_and_accept_from_later_branches(on):
    model = on("small")
    expected = ar(model, max_new_tokens=60)
    result = speculative.generate(model, PromptLookupTreeCandidates(k=5, branches=4, nodes=16), PROMPT, 60,
                                  stop_ids=[])
    assert result.tokens == expected
    assert sum(result.accepted_per_step) >= 10


def test_a_one_branch_lookup_tree_is_the_chain():
    """branches=1 proposes what the chain proposes: the same tokens, steps and acceptances."""
    model = MODELS["small"]()
    chain = speculative.generate(model, PromptLookupCandidates(k=5), PROMPT, 60, stop_ids=[])
    tree = speculative.generate(model, PromptLookupTreeCandidates(k=5, branches=1), PROMPT, 60, stop_ids=[])
    assert (tree.tokens, tree.accepted_per_step, tree.proposed_per_step) == (
        chain.tokens, chain.accepted_per_step, chain.proposed_per_step)


@pytest.mark.parametrize("tokens, count, expected", [
    ([1, 2, 3, 1, 2, 4, 1, 2], 4, [(2, 2), (5, 2)]),  # both "1 2" (ties: the earliest first), two continuations
    ([1, 2, 3, 1, 2, 4, 1, 2], 1, [(2, 2)]),
    ([5, 6, 7, 5, 6, 7, 5, 6], 4, [(5, 5)]),  # the shorter match at 2 continues "7 5 6" too: one branch
    ([5, 6, 7, 8], 4, []),
])
def test_longest_matches_are_the_longest_first_one_per_continuation(tokens, count, expected):
    assert longest_matches(tokens, 1, count, depth=3) == expected


@pytest.mark.parametrize("make, problem", [
    (lambda: DraftTreeCandidates(None, depth=0), "depth must be an integer >= 1, got 0"),
    (lambda: DraftTreeCandidates(None, nodes=2.5), "nodes must be an integer >= 1, got 2.5"),
    (lambda: PromptLookupTreeCandidates(branches=0), "branches must be an integer >= 1, got 0"),
    (lambda: DraftTreeCandidates(None, shape=[(-1, 0), (-1, 0)]), "siblings of distinct ranks"),
    (lambda: DraftTreeCandidates(None, shape=[(0, 0)]), "parent 0"),
    (lambda: DraftTreeCandidates(None, confidence_threshold=0.4), "applies to a fixed tree"),
    (lambda: DraftTreeCandidates(None, shape=[(-1, 0)], confidence_threshold=1.0), r"must be in \[0, 1\), got 1.0"),
])
def test_bad_tree_settings_are_refused(make, problem):
    with pytest.raises(ValueError, match=problem):
        make()
