"""What a speculative step is expected to gain, from acceptance and measured costs: Leviathan et
al.'s formula and T(n), the cost of one forward over n tokens, read off a measured curve.

No pandas: decoders (the hybrid candidate source) use this. A cost curve is any mapping n -> cost
(a dict, or a pandas Series indexed by n).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
