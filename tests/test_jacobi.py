"""Jacobi decoding: exact greedy output, forward counting, block statistics (tiny random models)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from transformers import LlamaForCausalLM

from specdec_lab.decoders import autoregressive, jacobi
from specdec_lab.quality import common_prefix_length
from tiny import copy_llama, tiny_llama
from specdec_lab.decoders.jacobi import block_statistics, count_fixed, stationary_tokens
from specdec_lab.result import BlockTrace, JacobiBlock

PROMPT = [1, 5, 9, 14, 3, 22, 7]


def tiny_model(seed: int = 0, vocab: int = 48) -> LlamaForCausalLM:
    return tiny_llama(seed, vocab_size=vocab, hidden=32, weight_std=0.3, eos_token_id=None)


@contextmanager
def counting_forwards(model):
    """Yields a list that gets one entry per forward pass of `model` inside the block."""
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()



@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("block_size", [1, 2, 5, 16])
@pytest.mark.parametrize("init", jacobi.INITS)
def test_jacobi_equals_greedy_ar(model, block_size, init):
    expected = autoregressive.generate(model, PROMPT, 40, stop_ids=[]).tokens
    with counting_forwards(model) as forwards:
        result = jacobi.generate(model, PROMPT, 40, block_size=block_size, init=init, stop_ids=[])
    assert result.tokens == expected
    assert result.target_forwards == len(forwards) == 1 + len(result.accepted_per_step)  # the passes really run
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
    with counting_forwards(model) as forwards:
        result = jacobi.generate(model, PROMPT, 30, block_size=6, init="repeat_last", stop_ids=[], record_states=True)
    blocks = result.jacobi.traces
    assert [t for block in blocks for t in block.fixed_point] == result.tokens[: sum(len(b.fixed_point) for b in blocks)]
    for block in blocks:
        assert block.start == sum(len(b.fixed_point) for b in blocks if b.start < block.start)
        assert block.states[0][0] == block.fixed_point[0]  # a block starts from the token known to come next
        # each iteration fixes exactly the correct tokens its state holds past the already fixed part
        done = 0
        for state, fixed in zip(block.states, block.fixed_per_iteration):
            assert common_prefix_length(state, block.fixed_point) == done + fixed
            done += fixed
        if block.converged:
            assert block.states[-1] == block.fixed_point
    assert len(result.jacobi.blocks) == len(blocks)
    assert 1 + sum(b.iterations for b in result.jacobi.blocks) == len(forwards)  # one pass per iteration


def test_output_does_not_depend_on_the_initial_guess(model):
    outputs = {tuple(jacobi.generate(model, PROMPT, 25, block_size=7, init=init, seed=seed, stop_ids=[]).tokens)
               for init in jacobi.INITS for seed in (0, 1)}
    assert len(outputs) == 1


def test_max_iterations_keeps_the_output_exact(model):
    expected = autoregressive.generate(model, PROMPT, 30, stop_ids=[]).tokens
    result = jacobi.generate(model, PROMPT, 30, block_size=8, max_iterations=1, stop_ids=[])
    assert result.tokens == expected
    assert max(b.iterations for b in result.jacobi.blocks) == 1


# --- several tokens fixed in one iteration -----------------------------------------------------
# A random tiny model fixes about one token per iteration, so bookkeeping that only matters when an
# iteration fixes several goes unseen. COPY continues a prompt with its last three tokens, over and
# over, and predicts each token from the one three back: once a block's first token is fixed, the
# next three are right (and fixed together) an iteration later. It reads every token's position from
# the KV cache, so a cache holding one entry too many or too few changes its output.

COPY = copy_llama(lag=3)


@pytest.mark.parametrize("block_size", [4, 7, 8])
@pytest.mark.parametrize("init", jacobi.INITS)
def test_several_tokens_fixed_in_one_iteration_stay_exact(block_size, init):
    """Catches a cache that keeps KV entries of unfixed tokens (or of the first fixed token only),
    and the next block's first token taken from the wrong prediction."""
    expected = autoregressive.generate(COPY, PROMPT, 40, stop_ids=[]).tokens
    result = jacobi.generate(COPY, PROMPT, 40, block_size=block_size, init=init, stop_ids=[], record_states=True)
    assert result.tokens == expected
    fixed = [trace.fixed_per_iteration for trace in result.jacobi.traces]
    assert all(max(per_block) >= 2 for per_block in fixed), fixed  # every block fixed several at once
    assert any(3 in per_block for per_block in fixed), fixed
    assert all(block.fast_forward >= 2 for block in result.jacobi.blocks)
    assert result.tokens_per_target_forward > 1.8


def test_a_stop_token_among_several_fixed_tokens_ends_the_generation():
    """The output continues 3, 22, 7, 3, ...; the second iteration fixes 22, 7 and 3 at once. Stopping
    at 7 must end decoding there, not only cut the output afterwards."""
    expected = autoregressive.generate(COPY, PROMPT, 40, stop_ids=[7]).tokens
    assert expected == [3, 22, 7]
    with counting_forwards(COPY) as forwards:
        result = jacobi.generate(COPY, PROMPT, 40, block_size=7, stop_ids=[7], record_states=True)
    assert result.tokens == expected
    assert result.jacobi.traces[0].fixed_per_iteration == [1, 3]
    assert result.target_forwards == len(forwards) == 3  # prefill + two iterations, nothing after the stop


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


@contextmanager
def recording_widths(module):
    """Yields a list that gets, for every forward of a sequence `module` opens, the tokens it was fed."""
    widths, opened = [], module.open_sequence

    def open_counted(model):
        sequence = opened(model)
        forward = sequence.forward

        def counted(token_ids, *args, **kwargs):
            widths.append(len(token_ids))
            return forward(token_ids, *args, **kwargs)
        sequence.forward = counted
        return sequence
    module.open_sequence = open_counted
    try:
        yield widths
    finally:
        module.open_sequence = opened


@pytest.mark.parametrize("decoder", ["autoregressive", "jacobi", "lookahead"])
def test_each_decode_forwards_width_is_recorded_as_fed(decoder):
    from specdec_lab.decoders import lookahead

    module = {"autoregressive": autoregressive, "jacobi": jacobi, "lookahead": lookahead}[decoder]
    model = copy_llama(lag=4)  # repeats the prompt: Jacobi fixes several tokens a forward, lookahead accepts n-grams
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    lookahead.check_custom_mask_support(model)  # its probe's forwards before the count
    with recording_widths(module) as widths:
        if decoder == "jacobi":
            result = jacobi.generate(model, prompt, 20, block_size=6)
        elif decoder == "lookahead":
            result = lookahead.generate(model, prompt, 20, window=3, ngram_size=3, candidates=2, pool_from_prompt=True)
        else:
            result = autoregressive.generate(model, prompt, 20)
    assert result.forward_tokens == widths[1:]  # the first forward is the prefill
    assert len(result.forward_tokens) == result.target_forwards - 1
    assert max(widths[1:]) > 1 or decoder == "autoregressive"
