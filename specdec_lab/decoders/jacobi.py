"""Jacobi decoding (Santilli et al. 2023; Kou et al. 2024, "CLLMs"): guess an n-token block and
refine all n positions in parallel until the block stops changing. Greedy only.

One iteration = one forward pass over the block: position i takes the argmax given the prompt, the
converged tokens and the current guesses before it. The block's fixed point is exactly the greedy
autoregressive continuation, so the output equals `autoregressive.generate` (fp32: token for token).

Counting, as in the CLLM reference code: the first position of the still-open part of a block is
always correct (it was predicted from a correct context), so every iteration fixes the longest
prefix of the open part that agrees with the model's own predictions, at least one token. Fixed
tokens keep their KV-cache entries (computed from a correct context); the rest of the block is
dropped from the cache and carried over, updated, as the next guess. When a block converges, the
prediction after its last token is the first (known) token of the next block.

Per iteration, `accepted_per_step` = tokens fixed - 1 (what AR would not have given) and
`proposed_per_step` = open block length, so `tokens_per_target_forward` means what it means for
speculative decoding. A plain AR model gets ~1.05 tokens per forward this way; a CLLM more.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import torch

from specdec_lab.decoders.autoregressive import prefill
from specdec_lab.decoders.backend import Sequence, open_sequence
from specdec_lab.decoders.common import DecodingRun, Provenance, cut_at_stop
from specdec_lab.quality import common_prefix_length
from specdec_lab.sampling import greedy_tokens
from specdec_lab.result import (CORRECTION, FAST_FORWARD, STATIONARY, TARGET, BlockTrace, GenerationResult,
                                JacobiBlock, JacobiStats)

INITS = ("prompt_tokens", "repeat_last")


def initial_guess(known_token: int, length: int, prompt_ids: list[int], init: str, rng: random.Random) -> list[int]:
    """A block of `length` tokens: the known first token, then `length - 1` guesses."""
    if init == "repeat_last":
        guesses = [known_token] * (length - 1)
    else:  # "prompt_tokens": random prompt tokens, as the CLLM reference code initialises
        guesses = [rng.choice(prompt_ids) for _ in range(length - 1)]
    return [known_token, *guesses]


def count_fixed(open_block: list[int], predictions: list[int]) -> int:
    """Tokens of the open block that are now certain: the first one, then each guess that equals the
    model's prediction from the (certain) tokens before it."""
    fixed = 1
    while fixed < len(open_block) and open_block[fixed] == predictions[fixed - 1]:
        fixed += 1
    return fixed


def stationary_positions(states: list[list[int]], fixed_point: list[int]) -> list[bool]:
    """For each position: was it already correct, and did it stay unchanged, while an earlier token was
    still wrong (the paper's "stationary tokens")? Its correct-from iteration precedes its fixed-at one."""
    stationary = []
    for position in range(len(fixed_point)):
        correct_from = len(states)  # first iteration from which the position is correct for good
        for iteration in range(len(states) - 1, -1, -1):
            if states[iteration][position] != fixed_point[position]:
                break
            correct_from = iteration
        fixed_at = next((j for j, s in enumerate(states) if common_prefix_length(s, fixed_point) > position),
                        len(states))
        stationary.append(correct_from < fixed_at)
    return stationary


def stationary_tokens(states: list[list[int]], fixed_point: list[int]) -> int:
    return sum(stationary_positions(states, fixed_point))


def block_statistics(trace: BlockTrace) -> JacobiBlock:
    """Iterations, fast-forwarded tokens (fixed beyond one per iteration) and stationary tokens."""
    return JacobiBlock(
        iterations=len(trace.states),
        fast_forward=sum(fixed - 1 for fixed in trace.fixed_per_iteration),
        stationary=stationary_tokens(trace.states, trace.fixed_point),
    )


def jacobi_iteration(sequence: Sequence, state: list[int], fixed_in_block: int, cached_length: int) -> tuple[list[int], int, int]:
    """One parallel refinement of the open part of a block (the cache holds the `cached_length`
    tokens before it). Returns the new block state, how many tokens became fixed, and the certain
    token after them. Only the fixed tokens' cache entries are kept: they saw a correct context."""
    open_block = state[fixed_in_block:]
    predictions = greedy_tokens(sequence.forward(open_block)).tolist()
    fixed = count_fixed(open_block, predictions)
    sequence.crop(cached_length + fixed)
    # every open position takes the prediction from the guesses before it; the first stays (it was certain)
    new_state = state[:fixed_in_block] + [open_block[0]] + predictions[: len(open_block) - 1]
    return new_state, fixed, predictions[fixed - 1]


def _check_arguments(block_size: int, init: str, max_iterations: int | None) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1 (1 = plain AR), got {block_size!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if max_iterations is not None and max_iterations < 1:
        raise ValueError(f"max_iterations must be >= 1 or None (no limit), got {max_iterations!r}")


@torch.inference_mode()
def generate(
    model,
    prompt_ids,
    max_new_tokens: int,
    block_size: int = 16,
    init: str = "prompt_tokens",
    stop_ids: Iterable[int] | None = None,
    seed: int = 0,
    max_iterations: int | None = None,
    record_states: bool = False,
) -> GenerationResult:
    """Greedy Jacobi decoding, batch size 1, any causal LM on either engine (`backend`).

    `seed` only drives the initial guesses (the output does not depend on it). `max_iterations`
    caps the iterations per block: the block then ends with what is fixed and the next one starts
    fresh (the output stays exact). `record_states=True` returns every block's trajectory in
    `result.jacobi.traces` (used to collect CLLM training data).
    """
    run = DecodingRun(model, prompt_ids, max_new_tokens, stop_ids)
    _check_arguments(block_size, init, max_iterations)
    prompt_ids, stop_ids = run.prompt_ids, run.stop_ids
    rng = random.Random(seed)
    sequence = open_sequence(model)
    tokens: list[int] = []  # fixed generated tokens; the cache holds prompt + tokens
    accepted_per_step, proposed_per_step, traces = [], [], []
    # per token: the prefill yields the first; iteration s confirms guesses (fast-forwarded) and yields
    # the next certain token, a correction where the guess at its position was wrong
    provenance = Provenance()

    with run:
        known = int(greedy_tokens(prefill(sequence, prompt_ids)))  # the next token, certain
        provenance.add(0, [TARGET])
        run.first_token_done()
        stopped = known in stop_ids or max_new_tokens == 1
        while not stopped:
            length = min(block_size, max_new_tokens - len(tokens))
            state = initial_guess(known, length, prompt_ids, init, rng)
            trace = BlockTrace(start=len(tokens), states=[], fixed_per_iteration=[], fixed_point=[], converged=False)
            fixed_in_block = 0
            while True:
                trace.states.append(state)
                proposed_per_step.append(length - fixed_in_block)
                state, fixed, known = jacobi_iteration(sequence, state, fixed_in_block,
                                                       len(prompt_ids) + len(tokens) + fixed_in_block)
                fixed_in_block += fixed
                provenance.add(len(accepted_per_step) + 1,
                               [FAST_FORWARD] * (fixed - 1) + [CORRECTION if fixed_in_block < length else TARGET])
                trace.fixed_per_iteration.append(fixed)
                accepted_per_step.append(fixed - 1)
                certain = state[fixed_in_block - fixed: fixed_in_block] + [known]
                stopped = any(t in stop_ids for t in certain) or len(tokens) + fixed_in_block + 1 >= max_new_tokens
                trace.converged = fixed_in_block == length
                if trace.converged or stopped or len(trace.states) == max_iterations:
                    break
            # a block cut short still knows the token at position fixed_in_block (= known)
            trace.fixed_point = state[: min(fixed_in_block + 1, length)] if stopped else state[:fixed_in_block]
            trace.fixed_point, _ = cut_at_stop(trace.fixed_point, stop_ids)
            tokens += state[:fixed_in_block]
            traces.append(_cut_trace(trace))
            mark_stationary(provenance, traces[-1])
        generated, _ = cut_at_stop(tokens + [known], stop_ids)
        generated = generated[:max_new_tokens]

    statistics = JacobiStats(block_size, init, [block_statistics(trace) for trace in traces],
                             traces if record_states else None)
    return run.result(
        generated,
        accepted_per_step=accepted_per_step,
        proposed_per_step=proposed_per_step,
        target_forwards=1 + len(accepted_per_step),
        forward_tokens=list(proposed_per_step),  # an iteration feeds the block's open part: what it proposes
        jacobi=statistics,
        **provenance.cut(len(generated)),
    )


def mark_stationary(provenance: Provenance, trace: BlockTrace) -> None:
    """Relabel the block's fast-forwarded tokens that were stationary."""
    for position, stationary in enumerate(stationary_positions(trace.states, trace.fixed_point)):
        if stationary and provenance.origins[trace.start + position] == FAST_FORWARD:
            provenance.origins[trace.start + position] = STATIONARY
def _cut_trace(trace: BlockTrace) -> BlockTrace:
    """States cut to the length of the (possibly truncated) fixed point, so they compare position by position."""
    n = len(trace.fixed_point)
    return BlockTrace(trace.start, [s[:n] for s in trace.states], trace.fixed_per_iteration, trace.fixed_point,
                      trace.converged)
