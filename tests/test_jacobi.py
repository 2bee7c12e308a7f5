"""Jacobi decoding: exact greedy output, forward counting, block statistics (tiny random models)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from specdec_lab.decoders import autoregressive, jacobi
from tiny import tiny_llama
from specdec_lab.decoders.jacobi import block_statistics, count_fixed, stationary_tokens
from specdec_lab.result import BlockTrace, JacobiBlock

PROMPT = [1, 5, 9, 14, 3, 22, 7]


def tiny_model(seed: int = 0, vocab: int = 48) -> LlamaForCausalLM:
    return tiny_llama(seed, vocab_size=vocab, hidden=32, weight_std=0.3, eos_token_id=None)



@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("block_size", [1, 2, 5, 16])
@pytest.mark.parametrize("init", jacobi.INITS)
def test_jacobi_equals_greedy_ar(model, block_size, init):
    expected = autoregressive.generate(model, PROMPT, 40, stop_ids=[]).tokens
    result = jacobi.generate(model, PROMPT, 40, block_size=block_size, init=init, stop_ids=[])
    assert result.tokens == expected
    assert result.target_forwards == 1 + len(result.accepted_per_step)
    # every iteration yields (accepted + 1) certain tokens, the prefill one more
    assert sum(result.accepted_per_step) + len(result.accepted_per_step) + 1 >= result.num_tokens
    assert all(p >= a + 1 for a, p in zip(result.accepted_per_step, result.proposed_per_step))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_jacobi_equals_greedy_ar_on_other_models(seed):
    model = tiny_model(seed)
    for block_size in (3, 8):
        expected = autoregressive.generate(model, PROMPT, 29, stop_ids=[]).tokens
        assert jacobi.generate(model, PROMPT, 29, block_size=block_size, stop_ids=[], seed=seed).tokens == expected


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13, 16, 17])
def test_max_new_tokens_inside_a_block(model, max_new_tokens):
    expected = autoregressive.generate(model, PROMPT, max_new_tokens, stop_ids=[]).tokens
    result = jacobi.generate(model, PROMPT, max_new_tokens, block_size=5, stop_ids=[])
    assert result.tokens == expected
    assert len(result.tokens) == max_new_tokens


@pytest.mark.parametrize("block_size", [4, 16])
def test_stops_after_first_eos_inside_a_block(model, block_size):
    reference = autoregressive.generate(model, PROMPT, 40, stop_ids=[]).tokens
    # a token whose first occurrence lies inside the first or second block
    position = next(i for i, t in enumerate(reference) if i >= 3 and t not in reference[:i])
    eos = reference[position]
    expected = autoregressive.generate(model, PROMPT, 40, stop_ids=[eos]).tokens
    result = jacobi.generate(model, PROMPT, 40, block_size=block_size, stop_ids=[eos])
    assert result.tokens == expected == reference[: position + 1]


def test_blocks_record_the_trajectory_and_its_fixed_point(model):
    result = jacobi.generate(model, PROMPT, 30, block_size=6, init="repeat_last", stop_ids=[], record_states=True)
    blocks = result.jacobi.traces
    assert [t for block in blocks for t in block.fixed_point] == result.tokens[: sum(len(b.fixed_point) for b in blocks)]
    for block in blocks:
        assert block.start == sum(len(b.fixed_point) for b in blocks if b.start < block.start)
        assert all(len(state) == len(block.fixed_point) for state in block.states)
        if block.converged:
            assert block.states[-1] == block.fixed_point
    assert len(result.jacobi.blocks) == len(blocks)
    assert sum(b.iterations for b in result.jacobi.blocks) == len(result.accepted_per_step)
    assert sum(b.fast_forward for b in result.jacobi.blocks) == sum(result.accepted_per_step)


def test_output_does_not_depend_on_the_initial_guess(model):
    outputs = {tuple(jacobi.generate(model, PROMPT, 25, block_size=7, init=init, seed=seed, stop_ids=[]).tokens)
               for init in jacobi.INITS for seed in (0, 1)}
    assert len(outputs) == 1


def test_max_iterations_keeps_the_output_exact(model):
    expected = autoregressive.generate(model, PROMPT, 30, stop_ids=[]).tokens
    result = jacobi.generate(model, PROMPT, 30, block_size=8, max_iterations=1, stop_ids=[])
    assert result.tokens == expected
    assert max(b.iterations for b in result.jacobi.blocks) == 1


def test_count_fixed():
    assert count_fixed([7, 1, 2, 3], [1, 2, 9, 4]) == 3  # 7 certain, 1 and 2 confirmed, 3 != 9
    assert count_fixed([7, 5, 2], [1, 2, 3]) == 1  # the first open token is always certain
    assert count_fixed([7, 1, 2], [1, 2, 3]) == 3


def test_stationary_and_fast_forward_counts():
    fixed_point = [1, 2, 3, 4]
    states = [[1, 9, 3, 4], [1, 2, 3, 4]]  # 3 and 4 right (and kept) while 2 was still wrong
    assert stationary_tokens(states, fixed_point) == 2
    trace = BlockTrace(start=0, states=states, fixed_per_iteration=[1, 3], fixed_point=fixed_point, converged=True)
    assert block_statistics(trace) == JacobiBlock(iterations=2, fast_forward=2, stationary=2)
    # a token that is right, then changes, then is right again counts from its last change only
    assert stationary_tokens([[1, 9, 9, 4], [1, 2, 8, 4], [1, 2, 3, 4]], fixed_point) == 1


@pytest.mark.parametrize("bad", [dict(block_size=0), dict(init="zeros"), dict(max_iterations=0)])
def test_bad_arguments_fail_early(model, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        jacobi.generate(model, PROMPT, 5, **bad)
