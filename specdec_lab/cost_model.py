"""What a speculative step is expected to gain, from acceptance and measured costs: Leviathan et
al.'s formula and T(n), the cost of one forward over n tokens, read off a measured curve.

No pandas: decoders (the hybrid candidate source) use this. A cost curve is any mapping n -> cost
(a dict, or a pandas Series indexed by n).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np


def predicted_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al. (2023), eq. 1: expected walltime improvement with acceptance rate alpha,
    draft length k and c = draft step time / target step time."""
    if alpha >= 1.0:
        return (k + 1) / (k * cost_ratio + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * cost_ratio + 1))


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens a step yields with k proposals accepted i.i.d. with probability alpha, the target's own
    token included: (1 - alpha^(k+1)) / (1 - alpha)."""
    return k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def cost_at(curve: Mapping[int, float], n: float) -> float:
    """T(n) (or T(n) / T(1)) from a curve n -> cost: linear between measured n, flat beyond its ends."""
    if n in curve:  # a measured n (every n of a `verify_costs` table, read at each decode step): no interpolation
        return float(curve[n])
    points = sorted((float(key), float(value)) for key, value in dict(curve).items())
    return float(np.interp(n, [key for key, _ in points], [value for _, value in points]))


def predicted_speedup_from_costs(alpha: float, k: int, target_ms: Mapping[int, float],
                                 draft_ms_per_token: float) -> float:
    """Leviathan's expected tokens per step with each step's measured cost: k draft tokens plus one
    target forward over k + 1 tokens, T(k+1), against T(1) per token for AR. `target_ms` is T(n)
    by n (linearly interpolated between measured n). With T(k+1) = T(1) and draft = c * T(1) this
    is eq. 1 (`predicted_speedup`)."""
    measured = sorted(dict(target_ms))
    if 1 not in measured or not k + 1 <= measured[-1]:  # never extrapolated
        raise ValueError(f"need T(1) and T(n) up to n = k + 1 = {k + 1}, measured n: {measured}: "
                         "measure the cost curve over a range that covers the draft lengths")
    return (expected_tokens_per_step(alpha, k) * cost_at(target_ms, 1)
            / (k * draft_ms_per_token + cost_at(target_ms, k + 1)))


def best_k_from_costs(alpha: float, target_ms: Mapping[int, float], draft_ms_per_token: float) -> tuple[int, float]:
    """The draft length with the highest `predicted_speedup_from_costs` among those the cost curve
    covers (k + 1 <= the largest measured n), and that speedup."""
    k_values = range(1, int(max(dict(target_ms))))
    predicted = {k: predicted_speedup_from_costs(alpha, k, target_ms, draft_ms_per_token) for k in k_values}
    best = max(predicted, key=predicted.get)
    return best, predicted[best]


def verify_costs(relative_target: Mapping[int, float], max_n: int) -> dict[int, float]:
    """T(n) / T(1) for n = 1 .. max_n, read off a measured curve once (flat beyond its last n), so a source
    that sizes its proposals at every step reads a small dict instead of interpolating a curve."""
    if relative_target is None or not len(relative_target):
        raise ValueError("sizing proposals by cost needs the target's measured T(n) / T(1) (the draft picker's or "
                         "the engine's cost curve): pass it, or leave the source uncut")
    return {n: cost_at(relative_target, n) for n in range(1, max_n + 1)}


def nodes_worth_verifying(probabilities: Sequence[float], relative_target: Mapping[int, float]) -> int:
    """How many of a proposal's nodes to verify, taken in their order (most probable first, so that any
    prefix is a tree), node i accepted with `probabilities[i]` (its path's product): the count n with the
    most expected tokens per unit of cost, (1 + the first n probabilities) / (T(n + 1) / T(1)), the target's
    own token counted. 0: a plain step (1 token for T(1)) is worth more than any prefix. Where T(n) is flat
    (bf16 with AMX) every node is nearly free; where it is steep (AVX2 only: T(16) = 6 T(1)) only the
    likely ones pay for the tokens they add."""
    return batch_width_worth_verifying([list(probabilities)], relative_target)  # a batch of one row


def acceptance_alpha(accepted_per_step: Sequence[Sequence[int]], proposed_per_step: Sequence[Sequence[int]]) -> float:
    """Per-token acceptance probability alpha (Leviathan's i.i.d. model) from the counts actually
    proposed, one sequence of steps per generation: accepted tokens / (accepted tokens +
    rejections), a rejection being a step that kept fewer than it proposed. Steps near the end
    propose fewer tokens and count as they were."""
    accepted = rejected = 0
    for kept_steps, proposed_steps in zip(accepted_per_step, proposed_per_step):
        for kept, proposed in zip(kept_steps, proposed_steps):
            accepted += kept
            rejected += kept < proposed
    return accepted / (accepted + rejected) if accepted + rejected else float("nan")


# --- token trees: Sequoia's dynamic programme ---------------------------------------------------------

def tree_expected_accepted(rank_acceptance: Sequence[float], nodes: int, depth: int) -> float:
    """The most tokens a greedy token tree of at most `nodes` nodes and `depth` levels is expected to
    have accepted a step, and (Sequoia, Chen et al. 2024) the tree's shape that gives it: with
    `rank_acceptance[r]` the chance that the target's token is the draft's (r+1)-th ranked child of a
    node, the same at every node, a node is accepted with the product of its path's chances, and the
    expected accepted tokens are the sum of that over the tree's nodes. A chain of k is
    sum_{i<=k} a_1^i, Leviathan's expectation without its bonus token."""
    return _tree_value(tuple(float(a) for a in rank_acceptance), int(nodes), int(depth))


@lru_cache(maxsize=None)
def _tree_value(ranks: tuple[float, ...], nodes: int, depth: int) -> float:
    """Best expected accepted tokens in the subtrees under one node: `nodes` nodes below it, `depth`
    levels. Child r (ranks[r]) takes m of the nodes: itself and m - 1 in its own subtree."""
    if nodes <= 0 or depth <= 0:
        return 0.0
    best_from = [0.0] * (nodes + 1)  # ranks r.. with n nodes, filled from the last rank back
    for a in reversed(ranks):
        best_from = [max([best_from[n], *(a * (1 + _tree_value(ranks, m - 1, depth - 1)) + best_from[n - m]
                                          for m in range(1, n + 1))]) for n in range(nodes + 1)]
    return best_from[nodes]


def predicted_tree_speedup(rank_acceptance: Sequence[float], nodes: int, depth: int,
                           relative_target: Mapping[int, float], draft_level_cost: float) -> float:
    """Expected speedup over AR of a draft tree (steady state, no prefill): 1 + the expected accepted
    tokens a step, against one target forward over nodes + 1 tokens (T(n) / T(1) from
    `relative_target`) plus `depth` draft forwards of `draft_level_cost` target steps each."""
    tokens = 1 + tree_expected_accepted(rank_acceptance, nodes, depth)
    return tokens / (cost_at(relative_target, nodes + 1) + depth * draft_level_cost)


def tree_shape(rank_acceptance: Sequence[float], nodes: int, depth: int) -> list[tuple[int, int]]:
    """The tree that `tree_expected_accepted` found: (parent, rank) per node, level by level (parents
    first, -1 the root; rank 0 is the draft's most likely child)."""
    ranks = tuple(float(a) for a in rank_acceptance)
    shape, frontier = [], [(-1, int(nodes), int(depth))]  # (node, nodes below it, levels below it)
    while frontier:
        following = []
        for parent, budget, levels in frontier:
            for rank, taken in enumerate(_allocation(ranks, budget, levels)):
                if taken:
                    shape.append((parent, rank))
                    following.append((len(shape) - 1, taken - 1, levels - 1))
        frontier = following
    return shape


def _allocation(ranks: tuple[float, ...], nodes: int, depth: int) -> list[int]:
    """How many of `nodes` each ranked child takes (itself and its subtree) in the best subtrees."""
    if nodes <= 0 or depth <= 0:
        return [0] * len(ranks)
    best = [[0.0] * (nodes + 1) for _ in range(len(ranks) + 1)]  # best[r][n]: ranks r.. with n nodes
    taken = [[0] * (nodes + 1) for _ in ranks]
    for r in reversed(range(len(ranks))):
        for n in range(nodes + 1):
            best[r][n] = best[r + 1][n]
            for m in range(1, n + 1):
                value = ranks[r] * (1 + _tree_value(ranks, m - 1, depth - 1)) + best[r + 1][n - m]
                if value > best[r][n] + 1e-12:
                    best[r][n], taken[r][n] = value, m
    allocation, left = [], nodes
    for r in range(len(ranks)):
        allocation.append(taken[r][left])
        left -= taken[r][left]
    return allocation


def shape_value(rank_acceptance: Sequence[float], shape: Sequence[tuple[int, int]]) -> float:
    """Expected accepted tokens of a given (parent, rank) tree under `rank_acceptance`."""
    reach = []
    for parent, rank in shape:
        chance = rank_acceptance[rank] if rank < len(rank_acceptance) else 0.0
        reach.append(chance * (reach[parent] if parent >= 0 else 1.0))
    return sum(reach)


# --- batches: speculation at batch size b ---------------------------------------------------------------

def batch_speedup_from_costs(alpha: float, k: int, target_ms: Mapping[int, Mapping[int, float]],
                             draft_ms: Mapping[int, Mapping[int, float]], batch: int) -> float:
    """Predicted throughput of batched speculative decoding over batched AR at batch size b. Every row
    yields E(alpha, k) tokens a step (Leviathan's expectation), and a step costs one target forward over
    b rows of k + 1 tokens, T_b(k + 1), plus k draft forwards over b rows of one token, D_b(1); batched
    AR makes b tokens per T_b(1):

        E(alpha, k) * T_b(1) / (T_b(k + 1) + k * D_b(1))

    `target_ms[b][n]` and `draft_ms[b][n]` are measured forwards over b rows of n tokens each. As b grows,
    T_b(k + 1) leaves the flat part of the curve first (it holds b(k + 1) tokens), and speculation stops paying."""
    target, draft = dict(target_ms[batch]), dict(draft_ms[batch])
    if 1 not in target or not k + 1 <= max(target) or 1 not in draft:  # never extrapolated
        raise ValueError(f"need T_b(1), T_b(n) up to n = k + 1 = {k + 1} and D_b(1) at batch {batch}; measured n: "
                         f"target {sorted(target)}, draft {sorted(draft)}")
    return (expected_tokens_per_step(alpha, k) * cost_at(target, 1)
            / (cost_at(target, k + 1) + k * cost_at(draft, 1)))


def best_k_per_batch(alpha: float, target_ms: Mapping[int, Mapping[int, float]],
                     draft_ms: Mapping[int, Mapping[int, float]], k_values: Sequence[int]) -> dict[int, tuple[int, float]]:
    """batch size -> (the draft length predicted fastest among `k_values`, its predicted throughput ratio)."""
    best = {}
    for batch in sorted(target_ms):
        predicted = {k: batch_speedup_from_costs(alpha, k, target_ms, draft_ms, batch) for k in k_values}
        k = max(predicted, key=predicted.get)
        best[batch] = (k, predicted[k])
    return best


def batch_width_worth_verifying(probabilities: Sequence[Sequence[float]], step_ms: Mapping[int, float]) -> int:
    """The width w of a batch's verify forward (each row's proposal cut to its first w tokens; a padded
    batch forward over b rows of w + 1 tokens costs T_b(w + 1) whatever each row holds) with the most
    expected tokens per unit of cost:

        (b + sum over rows r and i <= w of P_r(first i accepted)) / T_b(w + 1)

    `probabilities[r]` is row r's proposal, P_r(first i tokens accepted) for i = 1, 2, ...; each row adds
    the target's own token. 0: a plain step (b tokens for T_b(1)) is worth more than any width. One row
    is `nodes_worth_verifying`; at batch b a width pays only if the rows together fill it, since a
    row that proposes little pays for the longest proposal's columns."""
    longest = max((len(row) for row in probabilities), default=0)
    best_width, best_value = 0, len(probabilities) / cost_at(step_ms, 1)
    for width in range(1, longest + 1):
        expected = sum(1 + sum(row[:width]) for row in probabilities)
        value = expected / cost_at(step_ms, width + 1)
        if value > best_value:
            best_width, best_value = width, value
    return best_width


def crossover_batch(ratio_by_batch: Mapping[int, float]) -> int | None:
    """The smallest batch size at which speculation's throughput ratio over AR falls below 1 (where it
    stops paying), None if it pays at every batch size given."""
    return next((batch for batch in sorted(ratio_by_batch) if ratio_by_batch[batch] < 1.0), None)
