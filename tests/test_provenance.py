"""Every decoder labels each generated token with where it came from (the token views), and the labels
agree with the decoder's own counts: per target forward, the accepted tokens it yielded plus one of
the target's own; a correction exactly where a proposal was rejected; a tree's token off the first
branch marked as such; Jacobi's fast-forwarded and stationary tokens as its block statistics count
them."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from test_trees import OracleTrees
from tiny import PROMPT, copy_llama, tiny_llama
from specdec_lab.decoders import autoregressive, draft_then_score, jacobi, lookahead, speculative
from specdec_lab.decoders.candidates import (DraftModelCandidates, DraftTreeCandidates, HybridCandidates,
                                             PromptLookupCandidates, PromptLookupTreeCandidates)
from specdec_lab.result import (CORRECTION, DRAFT_MODEL, FAST_FORWARD, LOOKAHEAD_NGRAM, PROMPT_LOOKUP, STATIONARY,
                                TARGET, UNVERIFIED_DRAFT, GenerationResult, is_accepted_proposal, side_branch)

TARGET_MODEL = tiny_llama(seed=0)


def noisy_twin(model, std: float):
    """The target with noise on every matrix: a draft that agrees with it often, not always."""
    twin = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in twin.parameters():
            if parameter.dim() > 1:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * std)
    return twin


DRAFT = noisy_twin(TARGET_MODEL, 0.005)
REPETITIVE = PROMPT + [3, 4] + PROMPT[1:] + [12, 13]  # prompt lookup finds matches
COPY = copy_llama(lag=3)  # continues with period 3: Jacobi and lookahead fix several tokens at once


def tokens_per_forward(result: GenerationResult) -> list[int]:
    counts = Counter(result.token_steps)
    return [counts[step] for step in range(max(result.token_steps) + 1)]


def check_speculative_labels(result: GenerationResult, chain: bool = True) -> None:
    """Step s (forward s, the first one the prefill) yields its accepted tokens, then the target's own:
    for a chain, a correction exactly when fewer were accepted than proposed (a tree: see below)."""
    assert len(result.token_origins) == len(result.token_steps) == len(result.tokens)
    assert tokens_per_forward(result) == [accepted + 1 for accepted in result.accepted_per_step]
    start = 0
    for accepted, proposed in zip(result.accepted_per_step, result.proposed_per_step):
        step = result.token_origins[start:start + accepted + 1]
        assert all(is_accepted_proposal(origin) for origin in step[:-1]), step
        if chain:
            assert step[-1] == (CORRECTION if accepted < proposed else TARGET), (step, accepted, proposed)
        else:  # a tree's own token is a correction where the accepted path's last node had children
            assert step[-1] in (CORRECTION, TARGET) and (accepted < proposed or step[-1] == TARGET)
        start += accepted + 1
    assert sum(map(is_accepted_proposal, result.token_origins)) == sum(result.accepted_per_step)


def test_ar_writes_every_token_itself():
    result = autoregressive.generate(TARGET_MODEL, PROMPT, 12, stop_ids=[])
    assert result.token_origins == [TARGET] * 12 and result.token_steps == list(range(12))


@pytest.mark.parametrize("source, origin", [
    (lambda: DraftModelCandidates(DRAFT, 3), DRAFT_MODEL),
    (lambda: DraftModelCandidates(DRAFT, 3, "heuristic", 0.3), DRAFT_MODEL),
    (lambda: PromptLookupCandidates(4), PROMPT_LOOKUP),
])
def test_speculative_labels_agree_with_the_step_counts(source, origin):
    result = speculative.generate(TARGET_MODEL, source(), REPETITIVE, 40, stop_ids=[])
    check_speculative_labels(result)
    assert set(result.token_origins) == {origin, CORRECTION, TARGET}, Counter(result.token_origins)


def test_a_draft_accepted_whole_ends_every_step_with_the_targets_bonus_token():
    """The target drafting for itself: every step accepts its 4 and adds the bonus token, never a correction."""
    result = speculative.generate(TARGET_MODEL, DraftModelCandidates(TARGET_MODEL, 4), PROMPT, 40, stop_ids=[])
    check_speculative_labels(result)
    assert result.token_origins == ([DRAFT_MODEL] * 4 + [TARGET]) * 8


def test_the_hybrid_labels_each_token_by_the_source_that_proposed_it():
    """Looked-up tokens, drafted ones and the two joined in one proposal each keep their own source."""
    class Recording(HybridCandidates):
        def propose(self, tokens, max_candidates, sampling, rng):
            candidates = super().propose(tokens, max_candidates, sampling, rng)
            self.proposals.append((self.source, self.looked_up, len(candidates.token_ids)))
            return candidates

    hybrid = Recording(DRAFT, k=3, prompt_lookup_k=4, prior_acceptance=0.9, cost_ratio=0.1)
    hybrid.proposals = []
    result = speculative.generate(TARGET_MODEL, hybrid, REPETITIVE + PROMPT[2:5], 40, stop_ids=[])
    check_speculative_labels(result)
    assert {PROMPT_LOOKUP, DRAFT_MODEL} <= set(result.token_origins)
    start = 0
    for (source, looked_up, proposed), accepted in zip(hybrid.proposals, result.accepted_per_step):
        expected = {"nothing": [], "draft model": [DRAFT_MODEL] * proposed, "prompt lookup": [PROMPT_LOOKUP] * proposed,
                    "prompt lookup + draft model": [PROMPT_LOOKUP] * looked_up + [DRAFT_MODEL] * (proposed - looked_up)}
        assert result.token_origins[start:start + accepted] == expected[source][:accepted], source
        start += accepted + 1


def test_a_tree_token_behind_decoys_is_labelled_a_side_branch():
    """oracle_tree's path is the root's second child, that node's third child, then its only child:
    two side-branch tokens, then a first-branch one, then the target's bonus (the leaf has no child)."""
    free = autoregressive.generate(TARGET_MODEL, PROMPT, 30, stop_ids=[]).tokens
    result = speculative.generate(TARGET_MODEL, OracleTrees(free), PROMPT, 30, stop_ids=[])
    assert result.tokens == free
    check_speculative_labels(result, chain=False)
    tree_steps = [s for s, accepted in enumerate(result.accepted_per_step) if accepted == 3]
    assert tree_steps
    for step in tree_steps:
        origins = [o for o, s in zip(result.token_origins, result.token_steps) if s == step]
        assert origins == [side_branch("proposal"), side_branch("proposal"), "proposal", TARGET]


@pytest.mark.parametrize("source", [
    lambda: DraftTreeCandidates(DRAFT, depth=3, branching=2, beam=2, nodes=6),
    lambda: PromptLookupTreeCandidates(4, branches=3, nodes=10),
])
def test_tree_sources_label_their_tokens_and_corrections(source):
    result = speculative.generate(TARGET_MODEL, source(), REPETITIVE, 40, stop_ids=[])
    check_speculative_labels(result, chain=False)
    assert sum(map(is_accepted_proposal, result.token_origins)) > 0


def test_jacobi_labels_agree_with_its_block_statistics():
    """The prefill yields the first token; iteration s its fast-forwarded guesses and the next certain
    token. Fast-forwarded plus stationary labels are the blocks' fast-forward count, and the stationary
    ones their stationary count."""
    for model in (COPY, tiny_llama(0, vocab_size=16, hidden=32, weight_std=0.3, eos_token_id=None)):
        result = jacobi.generate(model, PROMPT, 40, block_size=7, stop_ids=[])
        origins = Counter(result.token_origins)
        yielded = [1] + [accepted + 1 for accepted in result.accepted_per_step]
        counted = tokens_per_forward(result)  # max_new_tokens may cut the last iteration's tokens short
        assert counted[:-1] == yielded[:len(counted) - 1] and counted[-1] <= yielded[len(counted) - 1]
        assert origins[FAST_FORWARD] + origins[STATIONARY] == sum(b.fast_forward for b in result.jacobi.blocks)
        assert origins[STATIONARY] == sum(b.stationary for b in result.jacobi.blocks)
        assert result.token_origins[0] == TARGET and set(origins) <= {TARGET, CORRECTION, FAST_FORWARD, STATIONARY}
    assert origins[CORRECTION] > 0  # the random model's guesses are often wrong
    copied = Counter(jacobi.generate(COPY, PROMPT, 40, block_size=7, stop_ids=[]).token_origins)
    assert copied[FAST_FORWARD] + copied[STATIONARY] >= 10


def test_lookahead_labels_its_accepted_ngrams():
    period_three = [1, 5, 9, 14, 3, 22, 7, 5, 9, 14]  # test_lookahead's: the copy model continues 5, 9, 14, ...
    result = lookahead.generate(COPY, period_three, 40, window=4, ngram_size=3, stop_ids=[])
    assert tokens_per_forward(result) == [accepted + 1 for accepted in result.accepted_per_step]
    assert result.token_origins.count(LOOKAHEAD_NGRAM) == sum(result.accepted_per_step) >= 10
    # a step that accepted a whole 2-token n-gram (N = 3) ends with the model's bonus token, not a correction
    by_step = [[o for o, s in zip(result.token_origins, result.token_steps) if s == step]
               for step in range(len(result.accepted_per_step))]
    whole = [origins for origins, accepted in zip(by_step, result.accepted_per_step) if accepted == 2]
    assert whole and all(origins == [LOOKAHEAD_NGRAM, LOOKAHEAD_NGRAM, TARGET] for origins in whole)
    assert all(origins[-1] == CORRECTION for origins, accepted in zip(by_step, result.accepted_per_step)
               if accepted < 2 and origins[0] == LOOKAHEAD_NGRAM)


def test_draft_then_score_marks_its_text_unverified():
    result = draft_then_score.generate(TARGET_MODEL, DRAFT, PROMPT, 10, stop_ids=[])
    assert result.token_origins == [UNVERIFIED_DRAFT] * 10


def test_labels_are_cut_with_the_tokens_at_a_stop_token():
    """A stop token inside an accepted block ends the text there; the labels end with it."""
    free = autoregressive.generate(TARGET_MODEL, PROMPT, 20, stop_ids=[]).tokens
    stop = free[6]
    result = speculative.generate(TARGET_MODEL, DraftModelCandidates(TARGET_MODEL, 4), PROMPT, 20, stop_ids=[stop])
    assert result.tokens == free[:free.index(stop) + 1]
    assert len(result.token_origins) == len(result.token_steps) == len(result.tokens)


def test_a_result_refuses_labels_that_do_not_cover_its_tokens():
    with pytest.raises(ValueError, match="token_origins has 1 entries for 2 tokens"):
        GenerationResult(prompt_length=1, tokens=[5, 6], token_origins=[TARGET])
