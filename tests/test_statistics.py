"""Every statistic behind a reported number, against a known answer on synthetic data: each test
fails if the statistic is computed another plausible way (named in its docstring)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specdec_lab import cost_model, metrics
from specdec_lab.result import GenerationResult


def test_the_95_percent_interval_covers_the_median_of_a_log_normal_as_often_as_the_bootstrap_should():
    """Per-prompt speedups drawn from a log-normal with median 1.3 (sigma 0.4, 20 prompts), 1,000
    seeded repetitions. The geometric mean estimates the median, and the percentile bootstrap of a
    mean of 20 covers about 93% of the time (the t-distribution's share within 1.96 * sqrt(19/20)
    standard errors: 0.929). A binomial bound on 1,000 repetitions: 905-955 covered. Fails for an
    interval of the arithmetic mean (it estimates exp(mu + sigma^2 / 2) = 1.41, not the median:
    about 60% coverage), for a 90% interval (about 874) and for a 99% one (about 979)."""
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(1000):
        speedups = np.exp(rng.normal(np.log(1.3), 0.4, size=20))
        low, high = metrics.bootstrap_interval(speedups)
        covered += low <= 1.3 <= high
    assert 905 <= covered <= 955, covered


def test_the_geometric_mean_is_the_one_aggregate_over_prompts():
    """Catches an arithmetic mean (2.5 here) or a median (2.0 here; 1.0 for the first set)."""
    assert metrics.geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert metrics.geometric_mean([0.5, 1.0, 8.0]) == pytest.approx(2 ** (2 / 3))
    assert metrics.over_prompts([0.5, 1.0, 8.0]).value == pytest.approx(2 ** (2 / 3))


def row(decoder, prompt, repeat, wall, tokens=8, first=0.2, accepted=(), proposed=()):
    return {"decoder": decoder, "prompt_id": prompt, "repeat": repeat, "category": "code", "tokens": list(range(tokens)),
            "wall_time_s": wall, "time_to_first_token_s": first, "accepted_per_step": list(accepted),
            "proposed_per_step": list(proposed)}


def test_a_prompts_repeats_are_summarized_by_their_median_before_the_mean_over_prompts():
    """Three repeats on prompt a (speedups 2, 2, 8) and one on b (speedup 1): the median per
    prompt, then the geometric mean over prompts, gives sqrt(2 * 1). Catches repeats pooled as if
    they were prompts ((2 * 2 * 8 * 1) ** (1/4) = 2.38) and a mean over repeats (4 for a: 2.0)."""
    rows = [row("ar", "a", r, 1.0) for r in range(3)] + [row("ar", "b", 0, 1.0)]
    rows += [row("fast", "a", r, wall) for r, wall in enumerate([0.5, 0.5, 0.125])] + [row("fast", "b", 0, 1.0)]
    found = metrics.mean_speedup(pd.DataFrame(rows), "fast", "ar")
    assert found.value == pytest.approx(2 ** 0.5) and found.prompts == 2


def test_the_speedup_is_a_ratio_of_time_per_generated_token_paired_by_prompt_and_repeat():
    """AR makes 8 tokens in 1 s; the method 4 tokens in 0.25 s (twice as fast per token, four times
    by wall time). Catches a wall-time ratio, and a ratio paired with another repeat's baseline."""
    rows = pd.DataFrame([row("ar", "a", 0, 1.0), row("ar", "a", 1, 2.0),
                         row("m", "a", 0, 0.25, tokens=4), row("m", "a", 1, 0.5, tokens=4)])
    speed = metrics.speedups(rows, "ar").set_index(["decoder", "repeat"])
    assert speed.speedup[("m", 0)] == pytest.approx(2.0) and speed.speedup[("m", 1)] == pytest.approx(2.0)
    assert speed.latency_ratio[("m", 0)] == pytest.approx(4.0)
    assert not speed.same_length[("m", 0)]


def test_decode_tokens_per_second_counts_the_tokens_after_the_first_over_the_time_after_it():
    """8 tokens in 1.0 s with the first at 0.3 s: 7 / 0.7 = 10 tokens/s. Catches the prefill left in
    (8 tokens/s) and all tokens over the decode time (11.4)."""
    rows = pd.DataFrame([row("ar", "a", 0, 1.0, first=0.3), row("ar", "b", 0, 1.0, tokens=1, first=1.0)])
    found = metrics.decode_tokens_per_second(rows)
    assert found.iloc[0] == pytest.approx(10.0) and np.isnan(found.iloc[1])  # one token: no decoding to time


def test_acceptance_by_position_against_a_hand_counted_table():
    """Steps (accepted, proposed): (3, 3), (1, 3), (0, 2), (2, 2), (0, 1). Position 1 was proposed in
    all 5 steps and accepted in 3; position 2 was reached (position 1 accepted, 2 proposed) in 3
    steps, (3, 3), (1, 3), (2, 2), and accepted in 2; position 3 was reached in 1 step and accepted.
    Catches the cumulative rate (position 2: 2 / 5), steps that stopped proposing counted as
    rejections, and steps rejected earlier counted at a later position."""
    rows = pd.DataFrame([row("m", "a", 0, 1.0, accepted=[3, 1, 0], proposed=[3, 3, 2]),
                         row("m", "b", 0, 1.0, accepted=[2, 0], proposed=[2, 1])])
    table = metrics.acceptance_by_position(rows).set_index("position")
    assert table.steps.to_dict() == {1: 5, 2: 3, 3: 1}
    assert table.acceptance.to_dict() == pytest.approx({1: 3 / 5, 2: 2 / 3, 3: 1.0})


def test_alpha_counts_rejections_not_proposals():
    """The same five steps: 6 accepted tokens, 2 rejections ((1, 3) and (0, 2); (0, 1) is a
    rejection too: 3 in all). alpha = 6 / 9. Catches accepted / proposed (6 / 11)."""
    assert cost_model.acceptance_alpha([[3, 1, 0], [2, 0]], [[3, 3, 2], [2, 1]]) == pytest.approx(6 / 9)


def test_tokens_per_forward_and_acceptance_of_one_result():
    """Catches the prefill left out of the forwards and acceptance counted per step."""
    result = GenerationResult(tokens=list(range(9)), prompt_length=5, wall_time_s=1.0, time_to_first_token_s=0.2,
                              target_forwards=3, accepted_per_step=[4, 1, 0], proposed_per_step=[4, 4, 0])
    assert result.tokens_per_target_forward == pytest.approx(3.0)
    assert result.acceptance_rate == pytest.approx(5 / 8)


def test_leviathan_expected_tokens_and_its_cost_model():
    """Catches the expected tokens per step off by one (alpha = 0 must give the target's one token,
    alpha = 1 all k + 1), the verification priced at T(1) or at T(k) instead of T(k + 1), and an
    extrapolated cost curve."""
    assert cost_model.expected_tokens_per_step(0.0, 4) == 1.0
    assert cost_model.expected_tokens_per_step(1.0, 4) == 5
    assert cost_model.expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    curve = {1: 100.0, 2: 110.0, 4: 130.0, 8: 200.0}
    assert cost_model.cost_at(curve, 3) == pytest.approx(120.0) and cost_model.cost_at(curve, 20) == 200.0
    # alpha 0.5, k 2, draft 10 ms: 1.75 tokens for 2 * 10 + T(3) = 140 ms, against 100 ms a token for AR
    assert cost_model.predicted_speedup_from_costs(0.5, 2, curve, 10.0) == pytest.approx(1.75 * 100 / 140)
    flat = {n: 100.0 for n in (1, 2, 4, 8)}
    assert cost_model.predicted_speedup_from_costs(0.8, 4, flat, 25.0) == pytest.approx(
        cost_model.predicted_speedup(0.8, 4, 0.25))  # flat T(n): eq. 1
    with pytest.raises(ValueError, match="up to n = k \\+ 1 = 9"):
        cost_model.predicted_speedup_from_costs(0.8, 8, curve, 10.0)
    best, speedup = cost_model.best_k_from_costs(0.5, curve, 10.0)
    assert speedup == max(cost_model.predicted_speedup_from_costs(0.5, k, curve, 10.0) for k in range(1, 8))
    assert speedup == cost_model.predicted_speedup_from_costs(0.5, best, curve, 10.0)


def sweep_rows():
    """AR and two constant-k decoders on two prompts of one category; k=2 accepts everything."""
    rows = []
    for prompt, wall_k2, wall_k4 in (("a", 0.5, 0.8), ("b", 0.5, 0.2)):
        rows.append(row("ar", prompt, 0, 1.0))
        rows.append(row("k2", prompt, 0, wall_k2, accepted=[2, 2], proposed=[2, 2]))
        rows.append(row("k4", prompt, 0, wall_k4, accepted=[4, 0], proposed=[4, 4]))
    return pd.DataFrame(rows)


def test_the_k_sweep_predicts_from_each_decoders_own_alpha_and_recommends_the_measured_best():
    """Catches alpha pooled over the decoders, the prediction made with another k, and a recommended
    k chosen by prediction instead of measurement (k=4 predicts less but measures more here)."""
    sweep = metrics.k_sweep(sweep_rows(), {"k2": 2, "k4": 4}, "ar", c=0.1)
    alpha = sweep.groupby("k").alpha.first()
    assert alpha[2] == 1.0 and alpha[4] == pytest.approx(4 / 5)
    assert sweep.groupby("k").predicted_speedup.first().to_dict() == pytest.approx(
        {2: cost_model.predicted_speedup(1.0, 2, 0.1), 4: cost_model.predicted_speedup(0.8, 4, 0.1)})
    measured = metrics.predicted_vs_measured(sweep).set_index("k")
    assert measured.speedup[2] == pytest.approx(2.0) and measured.speedup[4] == pytest.approx((1.25 * 5) ** 0.5)
    best = metrics.recommended_k(sweep)
    assert best.recommended_k.tolist() == [4] and best.speedup.iloc[0] == pytest.approx((1.25 * 5) ** 0.5)


def test_the_cost_ratio_is_a_ratio_of_median_step_times():
    """Catches a mean (one slow outlier step would move it) and the ratio inverted."""
    draft = pd.DataFrame({"ms_per_token": [10.0, 11.0, 100.0]})
    target = pd.DataFrame({"ms_per_token": [40.0, 44.0, 50.0]})
    assert metrics.cost_ratio(draft, target) == pytest.approx(11.0 / 44.0)


def test_pairs_of_other_length_are_counted():
    rows = pd.DataFrame([row("ar", "a", 0, 1.0), row("m", "a", 0, 0.5, tokens=6), row("ar", "b", 0, 1.0),
                         row("m", "b", 0, 0.5)])
    table = metrics.speedup_table(rows, "ar")
    assert table.pairs["m"] == 2 and table.pairs_of_other_length["m"] == 1


# --- Sequoia's dynamic programme over token trees ----------------------------------------------------

def all_trees(nodes: int, depth: int, ranks: int):
    """Every tree of at most `nodes` nodes and `depth` levels, as sets of rank paths (prefix-closed)."""
    found, frontier = {frozenset()}, [frozenset()]
    while frontier:
        grown = []
        for tree in frontier:
            if len(tree) == nodes:
                continue
            for parent in [(), *tree]:
                if len(parent) < depth:
                    for rank in range(ranks):
                        child = tree | {parent + (rank,)}
                        if len(child) > len(tree) and child not in found:
                            found.add(child)
                            grown.append(child)
        frontier = grown
    return found


def value(tree, acceptance):
    return sum(math.prod(acceptance[r] for r in path) for path in tree)


@pytest.mark.parametrize("acceptance", [[0.6, 0.2, 0.1], [0.3, 0.25, 0.2], [0.9, 0.05, 0.01]])
@pytest.mark.parametrize("nodes, depth", [(1, 1), (3, 2), (5, 3), (6, 2)])
def test_the_tree_programme_finds_the_best_tree(acceptance, nodes, depth):
    """Against every tree there is (brute force): the programme's value is the best, and the shape it
    returns has that value, no more nodes than allowed and no level deeper than allowed."""
    best = max(value(tree, acceptance) for tree in all_trees(nodes, depth, len(acceptance)))
    assert cost_model.tree_expected_accepted(acceptance, nodes, depth) == pytest.approx(best)
    shape = cost_model.tree_shape(acceptance, nodes, depth)
    assert cost_model.shape_value(acceptance, shape) == pytest.approx(best)
    assert len(shape) <= nodes and all(parent < node for node, (parent, _) in enumerate(shape))
    level = []
    for parent, _ in shape:
        level.append(1 if parent < 0 else level[parent] + 1)
    assert max(level) <= depth


def test_a_chain_is_leviathans_expectation():
    """One rank: the tree is a chain of k, and 1 + its expectation is Leviathan's tokens per step."""
    assert cost_model.tree_shape([0.7], 4, 4) == [(-1, 0), (0, 0), (1, 0), (2, 0)]
    assert 1 + cost_model.tree_expected_accepted([0.7], 4, 4) == pytest.approx(cost_model.expected_tokens_per_step(0.7, 4))
