"""The draft picker: its replay of a candidate source over the target's greedy output must take the
same steps as the real speculative decoder (tiny fp32 models), and its arithmetic must price them."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from specdec_lab.decoders import autoregressive, speculative
from specdec_lab.decoders.candidates import (DraftModelCandidates, DraftTreeCandidates, HybridCandidates,
                                            PromptLookupCandidates, PromptLookupTreeCandidates)
from specdec_lab.decoders.trees import depths
from specdec_lab.decoders.backend import open_sequence
from specdec_lab.experiments import picker
from tiny import tiny_llama

PROMPT = [1, 5, 9, 14, 3, 22, 7, 5, 9, 14, 30, 2]
TARGET = tiny_llama(0, vocab_size=48, hidden=32, weight_std=0.3, eos_token_id=None)


def noisy_copy(model, std: float, seed: int):
    """The target with its head perturbed: a draft that agrees on some tokens, not all."""
    draft = tiny_llama(0, vocab_size=48, hidden=32, weight_std=0.3, eos_token_id=None)
    draft.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=generator).to(draft.device) * std)
    return draft


DRAFT = noisy_copy(TARGET, std=0.6, seed=1)


@pytest.fixture(scope="module")
def greedy():
    return autoregressive.generate(TARGET, PROMPT, 48, stop_ids=[]).tokens


def steps(result):
    return result.proposed_per_step, result.accepted_per_step


@pytest.mark.parametrize("k, schedule", [(1, "constant"), (3, "constant"), (6, "constant"), (2, "heuristic")])
def test_replayed_draft_takes_the_decoders_steps(greedy, k, schedule):
    """Catches a forecast read one position off, proposals after a wrong token counted as right,
    and draft forwards miscounted."""
    real = speculative.generate(TARGET, DraftModelCandidates(DRAFT, k, schedule), PROMPT, 48, stop_ids=[])
    assert real.tokens == greedy
    run = picker.replay(picker.TeacherForcedDraft(picker.forecast_draft(DRAFT, PROMPT, greedy), k, schedule),
                        PROMPT, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real)
    assert run.draft_forwards == real.draft_forwards
    assert 0 < sum(run.accepted) < sum(run.proposed)  # the draft is right on some tokens, not all


def test_replayed_prompt_lookup_takes_the_decoders_steps(greedy):
    real = speculative.generate(TARGET, PromptLookupCandidates(4), PROMPT, 48, stop_ids=[])
    run = picker.replay(PromptLookupCandidates(4), PROMPT, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real) and run.draft_forwards == 0


CURVE = {1: 1.0, 2: 1.05, 4: 1.3, 9: 3.0}  # a cost curve steep enough to cut proposals


def test_replayed_cost_sized_prompt_lookup_takes_the_decoders_steps():
    repetitive = PROMPT + PROMPT[3:] + PROMPT
    greedy = autoregressive.generate(TARGET, repetitive, 48, stop_ids=[]).tokens
    real = speculative.generate(TARGET, PromptLookupCandidates(4, relative_target=CURVE), repetitive, 48, stop_ids=[])
    run = picker.replay(PromptLookupCandidates(4, relative_target=CURVE), repetitive, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real) and sum(run.proposed) > 0


@pytest.mark.parametrize("relative_target", [None, CURVE])
def test_replayed_hybrid_makes_the_decoders_choices(greedy, relative_target):
    """Without a confidence stop the replayed hybrid sees what the real one sees: the same sources,
    the same steps (with the stop, proposals after a wrong draft token can differ in number); priced by a
    cost curve or not."""
    def hybrid(draft=None):
        return HybridCandidates(DRAFT, 3, 4, cost_ratio=0.3, confidence_threshold=0.0, draft=draft,
                                relative_target=relative_target)
    real_source = hybrid()
    real = speculative.generate(TARGET, real_source, PROMPT, 48, stop_ids=[])
    forecast = picker.forecast_draft(DRAFT, PROMPT, greedy)
    replayed_source = hybrid(picker.TeacherForcedDraft(forecast, 3, "heuristic", 0.0))
    run = picker.replay(replayed_source, PROMPT, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real)
    assert replayed_source.sources == real_source.sources and "draft model" in real_source.sources


@pytest.mark.parametrize("relative_target", [None, CURVE])
def test_replayed_hybrid_drafting_a_tree_makes_the_decoders_choices(greedy, relative_target):
    """The hybrid drafting the picker's tree, replayed with the replayed tree: the same sources and steps as the real
    one. Catches the replay's hybrid drafting a chain where the line-up's drafts the tree."""
    shape = [(-1, 0), (-1, 1), (0, 0), (2, 0)]

    def hybrid(draft=None):
        return HybridCandidates(DRAFT, 3, 4, cost_ratio=0.3, confidence_threshold=0.0, draft=draft,
                                relative_target=relative_target, draft_tree=shape)
    real_source = hybrid()
    proposals = []
    propose = real_source.propose
    real_source.propose = lambda *args: proposals.append(propose(*args)) or proposals[-1]
    real = speculative.generate(TARGET, real_source, PROMPT, 48, stop_ids=[])
    # a tree was verified: two nodes under one parent
    assert any(p.parents and len(set(p.parents)) < len(p.parents) for p in proposals)
    settings = picker.hybrid_settings_grid(0.9, draft_tree="-1:0 -1:1 0:0 2:0")[0]
    replayed = picker.hybrid_candidate(3, 4, 0.3, settings, adaptive_threshold=0.0, relative_target=relative_target)
    replayed_source = replayed.make(picker.forecast_draft(DRAFT, PROMPT, greedy))
    assert isinstance(replayed_source.draft, picker.TeacherForcedTree)
    replayed_source.prior_acceptance = real_source.prior_acceptance
    run = picker.replay(replayed_source, PROMPT, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real)
    assert replayed_source.sources == real_source.sources and "draft model" in real_source.sources


def test_draft_agreement_is_the_teacher_forced_hit_rate(greedy):
    forecast = picker.forecast_draft(DRAFT, PROMPT, greedy)
    calibration = picker.Calibration("p", "code", PROMPT, greedy, 48, 0.5, 0.1, forecast)
    # the draft's own greedy choice after each prefix of the target's text, one forward at a time
    expected = sum(int(autoregressive.prefill(open_sequence(DRAFT), PROMPT + greedy[:i]).argmax()) == token
                   for i, token in enumerate(greedy)) / len(greedy)
    assert picker.draft_agreement([calibration]) == pytest.approx(expected)
    assert 0 < expected < 1
    same = picker.forecast_draft(TARGET, PROMPT, greedy)
    assert picker.draft_agreement([picker.Calibration("p", "code", PROMPT, greedy, 48, 0.5, 0.1, same)]) == 1.0


def test_predicted_time_prices_each_step():
    costs = picker.Costs(pd.Series([1.0, 1.5, 3.0], index=[1, 3, 5]), draft_cost_ratio=0.25)
    run = picker.Replay(proposed=[4, 2, 4, 0], accepted=[1, 2, 0, 0], draft_forwards=10)
    # steps after the first verify 3, 5 and 1 tokens: 1.5 + 3.0 + 1.0 AR steps; the draft's first
    # forward is its prefill (0.3 s), the other 9 cost 0.25 AR steps each
    assert picker.predicted_time(run, prefill_s=2.0, step_s=0.1, draft_prefill_s=0.3, costs=costs) == pytest.approx(
        2.0 + 0.3 + 0.1 * (5.5 + 9 * 0.25))
    lookup = picker.Replay(proposed=[4, 2], accepted=[1, 2], draft_forwards=0)
    assert picker.predicted_time(lookup, 2.0, 0.1, 0.3, costs) == pytest.approx(2.0 + 0.1 * 1.5)
    assert costs.verify(2) == pytest.approx(1.25) and costs.verify(9) == pytest.approx(3.0)


def test_transformers_rule_takes_the_first_occurrence():
    lookup = picker.FirstMatchLookup(k=2, max_ngram=2)
    tokens = [7, 8, 1, 7, 8, 2, 5, 7, 8]
    assert lookup.propose(tokens, 10, None, None).token_ids == [1, 7]  # the first 7, 8, not the latest
    assert lookup.propose([4, 5, 6], 10, None, None).token_ids == []


def test_recommend_takes_our_fastest_source_per_category():
    table = pd.DataFrame({"category": ["code", "code", "code", "chat", "chat"],
                          "source": ["lookup", "draft", "theirs", "lookup", "draft"],
                          "predicted_speedup": [3.0, 1.5, 3.5, 0.9, 1.2],
                          "implementation": ["ours", "ours", "transformers", "ours", "ours"]})
    assert picker.recommend(table).set_index("category").source.to_dict() == {"code": "lookup", "chat": "draft"}


def test_replay_caps_proposals_by_max_new_tokens_not_by_the_text():
    """A generation that stopped early (a stop token) still proposed up to max_new_tokens - 1."""
    model_stop = autoregressive.generate(TARGET, PROMPT, 48, stop_ids=[]).tokens
    stop = model_stop[20]
    real = speculative.generate(TARGET, PromptLookupCandidates(6), PROMPT, 48, stop_ids=[stop])
    run = picker.replay(PromptLookupCandidates(6), PROMPT, real.tokens, 48)
    assert (run.proposed, run.accepted) == steps(real)


class Proposes:
    """A candidate source that always proposes the same tokens."""

    forwards = 0

    def __init__(self, tokens):
        self.tokens = tokens

    def reset(self, vocab_size=None):
        pass

    def propose(self, tokens, max_candidates, sampling, rng):
        from specdec_lab.decoders.candidates import Candidates
        return Candidates(self.tokens[:max_candidates])

    def update(self, tokens, num_accepted, num_proposed):
        pass


def test_replay_ends_at_a_stop_token_a_proposal_runs_past():
    """The text stopped at token 3 after two tokens; the proposal (budget 10) holds it and more."""
    run = picker.replay(Proposes([7, 3, 9, 9]), PROMPT, [7, 3], max_new_tokens=10)
    assert (run.proposed, run.accepted) == ([4], [2])


# --- token trees: the replay, Sequoia's sizing ------------------------------------------------------------

SHAPES = [
    [(-1, 0), (-1, 1), (0, 0), (0, 1), (1, 0), (2, 0)],  # two branches at the root and under the top child
    [(-1, 0), (-1, 1), (-1, 2), (0, 0), (1, 0), (3, 0), (3, 1)],
    [(-1, 0), (0, 0), (1, 0), (2, 0), (-1, 1), (4, 0), (5, 0)],  # depth first: cut near the end, renumbered
]


@pytest.mark.parametrize("shape", SHAPES)
def test_replayed_draft_tree_takes_the_decoders_steps(greedy, shape):
    """The replayed Sequoia tree accepts what the real tree accepts, step for step: catches a rank read
    at the wrong depth, a tree filled from the wrong parent, and draft forwards miscounted."""
    real = speculative.generate(TARGET, DraftTreeCandidates(DRAFT, shape=shape), PROMPT, 48, stop_ids=[])
    assert real.tokens == greedy
    tree = picker.TeacherForcedTree(picker.forecast_draft(DRAFT, PROMPT, greedy), shape)
    run = picker.replay(tree, PROMPT, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real)
    assert run.draft_forwards == real.draft_forwards
    assert any(a > 0 for a in run.accepted)


PEAKED = tiny_llama(2, weight_std=0.3)  # its own draft: every drafted token is right, at top probabilities 0.2-0.6


@pytest.mark.parametrize("shape", [[(-1, 0), (0, 0), (1, 0), (2, 0), (3, 0)], SHAPES[0]])
def test_replayed_draft_tree_with_a_confidence_stop_takes_the_decoders_steps(shape):
    """The target as its own draft, so every main-path token is right and the confidence stop alone sets how
    deep each step drafts and accepts: the replay's stop, read off the forecast along y, is the real one (a
    stop read one level off, or on the wrong node, accepts another number of tokens)."""
    greedy = autoregressive.generate(PEAKED, PROMPT, 48, stop_ids=[]).tokens
    real = speculative.generate(PEAKED, DraftTreeCandidates(PEAKED, shape=shape, confidence_threshold=0.3), PROMPT,
                                48, stop_ids=[])
    tree = picker.TeacherForcedTree(picker.forecast_draft(PEAKED, PROMPT, greedy), shape, confidence_threshold=0.3)
    run = picker.replay(tree, PROMPT, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real)
    assert run.draft_forwards == real.draft_forwards
    assert len(set(run.accepted)) >= 3  # the stop cut at several depths


def test_replayed_prompt_lookup_tree_takes_the_decoders_steps(greedy):
    real = speculative.generate(TARGET, PromptLookupTreeCandidates(4, branches=3, nodes=10), PROMPT, 48, stop_ids=[])
    run = picker.replay(PromptLookupTreeCandidates(4, branches=3, nodes=10), PROMPT, greedy, 48)
    assert (run.proposed, run.accepted) == steps(real)


def test_rank_acceptance_counts_where_the_targets_token_ranks(greedy):
    forecast = picker.forecast_draft(DRAFT, PROMPT, greedy)
    calibration = picker.Calibration("p", "code", PROMPT, greedy, 48, 0.5, 0.1, forecast)
    ranks = picker.rank_acceptance([calibration], ranks=3)
    assert ranks[0] == pytest.approx(picker.draft_agreement([calibration]))
    sequence = open_sequence(DRAFT)
    logits = torch.cat([autoregressive.prefill(sequence, PROMPT)[None], sequence.forward(greedy[:-1])])
    second = (logits.argsort(-1, descending=True)[:, 1] == torch.tensor(greedy, device=logits.device)).float().mean()
    assert ranks[1] == pytest.approx(float(second)) and sum(ranks) <= 1


def test_the_sizing_keeps_a_chain_where_verifying_more_tokens_costs_more(greedy):
    """Flat T(n): the sized tree branches; T(n) growing as n: it is a chain (or nothing wider than it)."""
    forecast = picker.forecast_draft(DRAFT, PROMPT, greedy)
    calibration = [picker.Calibration("p", "code", PROMPT, greedy, 48, 0.5, 0.1, forecast)]
    flat = picker.Costs(pd.Series({1: 1.0, 32: 1.0}), 0.05)
    steep = picker.Costs(pd.Series({1: 1.0, 32: 32.0}), 0.05)
    wide, grid = picker.size_tree(calibration, flat, max_nodes=8, max_depth=6)
    assert len(wide) == 8 and max(depths([p for p, _ in wide])) < 8 and not grid.chain.all()
    narrow, _ = picker.size_tree(calibration, steep, max_nodes=8, max_depth=6)
    assert len(narrow) == max(depths([p for p, _ in narrow]))  # one node a level: a chain


def test_the_picker_weighs_the_suffix_trees_prior_only_for_a_hybrid_that_has_them(monkeypatch):
    """The grid adds `SUFFIX_PRIOR_GRID`'s weights where the hybrid proposes suffix trees, and the weight predicted
    fastest reaches the settings the line-up runs. Catches a grid without them and a choice that drops the field
    (the line-up would run the default whatever was predicted)."""
    from specdec_lab.method import HybridSettings

    with_trees = picker.hybrid_settings_grid(0.9, suffix=True)
    assert {settings.suffix_prior_tokens for settings in with_trees} == set(picker.SUFFIX_PRIOR_GRID)
    assert len(with_trees) == len(picker.SUFFIX_PRIOR_GRID) * len(picker.hybrid_settings_grid(0.9))
    assert {settings.suffix_prior_tokens for settings in picker.hybrid_settings_grid(0.9)} == {
        HybridSettings.suffix_prior_tokens}
    heaviest = max(picker.SUFFIX_PRIOR_GRID)
    # every setting predicted alike but the heaviest weight, predicted faster
    monkeypatch.setattr(picker, "predict", lambda calibrations, listed, costs: listed[0])
    monkeypatch.setattr(picker, "per_category", lambda candidate: pd.DataFrame(
        {"category": ["code"], "predicted_speedup": [2.0 if f"suffix_prior_tokens={heaviest}" in candidate.name else 1.0]}))
    costs = picker.Costs(pd.Series({1: 1.0, 32: 1.0}), 0.2)
    settings, grid = picker.choose_hybrid([], costs, 5, 10, 0.2, 0.9, cost_sized=True, suffix_k=16)
    assert settings.suffix_prior_tokens == heaviest and len(grid) == len(with_trees)


def test_the_hybrid_drafts_the_tree_the_picker_sized(monkeypatch):
    """Every setting the picker weighs carries its tree, the chosen one reaches the line-up, and the line-up's
    hybrid fills that tree. Catches a choice that drops the field (the line-up would draft chains whatever the
    picker sized and predicted)."""
    from specdec_lab.experiments import lineups

    label = "-1:0 -1:1 0:0 2:0"
    assert {settings.draft_tree for settings in picker.hybrid_settings_grid(0.9, suffix=True, draft_tree=label)} == {label}
    monkeypatch.setattr(picker, "predict", lambda calibrations, listed, costs: listed[0])
    monkeypatch.setattr(picker, "per_category", lambda candidate: pd.DataFrame(
        {"category": ["code"], "predicted_speedup": [2.0 if "extend_lookups=False" in candidate.name else 1.0]}))
    costs = picker.Costs(pd.Series({1: 1.0, 32: 1.0}), 0.2)
    settings, grid = picker.choose_hybrid([], costs, 5, 10, 0.2, 0.9, cost_sized=True, suffix_k=16, draft_tree=label)
    assert settings.draft_tree == label and not settings.extend_lookups and set(grid.draft_tree) == {label}
    made = []

    class Recorded(HybridCandidates):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(lineups, "HybridCandidates", Recorded)
    loaded = type("Loaded", (), {})
    target, draft = loaded(), loaded()
    target.model, draft.model = TARGET, DRAFT
    method = lineups.hybrid(target, draft, 5, 10, 16, 0.2, settings=settings)
    assert method.source.hybrid.draft_tree == label and "draft tree, 4 nodes, depth 3" in method.name
    assert method.decode(PROMPT).tokens == autoregressive.generate(TARGET, PROMPT, 16, stop_ids=None).tokens
    assert isinstance(made[0].draft, DraftTreeCandidates) and made[0].draft_tree == [(-1, 0), (-1, 1), (0, 0), (2, 0)]


def test_the_hybrids_prior_acceptance_is_the_drafts_measured_agreement(monkeypatch):
    """The picker does not choose the draft's prior acceptance by replay: every setting it weighs starts from the
    draft's teacher-forced agreement, and a fixed prior predicted faster cannot be chosen. Catches a grid that brings
    back fixed priors (chosen by noise on 2 prompts a kind) and a choice that drops the measured one."""
    for agreement in (0.42, 0.9, 1.0):
        grid = picker.hybrid_settings_grid(agreement, suffix=True)
        assert {settings.prior_acceptance for settings in grid} == {round(min(agreement, 0.99), 2)}
    # a prediction that would favour the class default, were it in the grid
    monkeypatch.setattr(picker, "predict", lambda calibrations, listed, costs: listed[0])
    monkeypatch.setattr(picker, "per_category", lambda candidate: pd.DataFrame(
        {"category": ["code"], "predicted_speedup": [3.0 if "prior_acceptance=0.6," in candidate.name else 1.0]}))
    costs = picker.Costs(pd.Series({1: 1.0, 32: 1.0}), 0.2)
    settings, _ = picker.choose_hybrid([], costs, 5, 10, 0.2, 0.42, cost_sized=True, suffix_k=16)
    assert settings.prior_acceptance == 0.42
