"""Lookahead decoding: fp32 output equals greedy AR on tiny Llama and Qwen2 models, the mask keeps
the branches apart, n-grams are accepted (and then the output must still be exact), and a model
that ignores a custom mask gets a clear error."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdec_lab.decoders import autoregressive, lookahead
from specdec_lab.decoders.lookahead import NgramPool, advance_window, best_candidate, lookahead_mask
from tiny import copy_llama, tiny_llama

PROMPT = [1, 5, 9, 14, 3, 22, 7, 5, 9, 14]


def tiny_qwen2(seed: int = 0, vocab: int = 48) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
    return model


MODELS = {
    "llama": lambda: tiny_llama(0, vocab_size=48, hidden=32, weight_std=0.3, eos_token_id=None),
    "qwen2": tiny_qwen2,
    # repeats the prompt's last 3 tokens: n-grams get accepted, several a step
    "copy": lambda: copy_llama(lag=3),
}


def count_forwards(model):
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


@pytest.mark.parametrize("window, ngram_size, candidates", [(5, 3, 5), (3, 2, 3), (4, 4, 2), (2, 3, 0), (1, 2, 1)])
@pytest.mark.parametrize("pool_from_prompt", [False, True])
def test_lookahead_equals_greedy_ar(model, window, ngram_size, candidates, pool_from_prompt):
    expected = autoregressive.generate(model, PROMPT, 40, stop_ids=[]).tokens
    result = lookahead.generate(model, PROMPT, 40, window=window, ngram_size=ngram_size, candidates=candidates,
                                pool_from_prompt=pool_from_prompt, stop_ids=[])
    assert result.tokens == expected
    # every pass yields its accepted n-gram tokens plus one token of the model's own
    assert sum(result.accepted_per_step) + len(result.accepted_per_step) == result.num_tokens == 40
    assert result.target_forwards == len(result.accepted_per_step)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("make", [lambda s: tiny_llama(s, vocab_size=16, hidden=32, weight_std=0.3, eos_token_id=None),
                                  lambda s: tiny_qwen2(s, vocab=16)])
def test_lookahead_equals_greedy_ar_with_accepted_ngrams(make, seed):
    """A 16-token vocabulary makes random models repeat themselves, so the pool's n-grams get
    accepted: a cache that kept the window's or the candidates' entries, or a next token taken from
    the wrong row, would change the output."""
    model, prompt = make(seed), [t % 16 for t in PROMPT]
    expected = autoregressive.generate(model, prompt, 60, stop_ids=[]).tokens
    result = lookahead.generate(model, prompt, 60, window=4, ngram_size=3, stop_ids=[], seed=seed)
    assert result.tokens == expected
    assert sum(result.accepted_per_step) >= 5, result.accepted_per_step


def test_several_ngram_tokens_accepted_in_one_pass():
    """The copy model continues 5, 9, 14, ... with period 3. It predicts a token from the one three
    back, so with N = 3 the newest level's first column copies the current token: after a few passes
    the lookahead branch holds the right 3-grams (no prompt n-grams here) and every pass accepts 2."""
    model = MODELS["copy"]()
    lookahead.check_custom_mask_support(model)
    forwards = count_forwards(model)
    result = lookahead.generate(model, PROMPT, 40, window=4, ngram_size=3, stop_ids=[])
    assert result.target_forwards == len(forwards)
    assert result.tokens == autoregressive.generate(model, PROMPT, 40, stop_ids=[]).tokens
    assert max(result.accepted_per_step) == 2 and result.accepted_per_step[-4:] == [2, 2, 2, 2]
    assert result.tokens_per_target_forward > 2.0


def test_forward_count_and_max_new_tokens_inside_an_ngram():
    model = MODELS["copy"]()
    lookahead.check_custom_mask_support(model)  # the probe's passes are not the decoder's
    forwards = count_forwards(model)
    for max_new_tokens in (1, 2, 5, 11):
        forwards.clear()
        result = lookahead.generate(model, PROMPT, max_new_tokens, window=3, ngram_size=4, pool_from_prompt=True,
                                    stop_ids=[])
        assert result.target_forwards == len(forwards)  # the first pass is also the prefill
        assert result.tokens == autoregressive.generate(model, PROMPT, max_new_tokens, stop_ids=[]).tokens
        assert len(result.tokens) == max_new_tokens


def test_stops_at_a_stop_token_inside_an_accepted_ngram():
    model = MODELS["copy"]()
    expected = autoregressive.generate(model, PROMPT, 40, stop_ids=[14]).tokens
    assert expected == [5, 9, 14]
    result = lookahead.generate(model, PROMPT, 40, window=3, ngram_size=4, pool_from_prompt=True, stop_ids=[14])
    assert result.tokens == expected
    # pass 1 yields 5 (the prompt's 14 -> 3, 22, 7 is rejected); pass 2 accepts the prompt's
    # 5 -> 9, 14, 3 up to 14, which stops the generation: no third pass
    assert result.accepted_per_step == [0, 2]


def test_mask_separates_the_branches():
    # 1 cached token, 2 inputs, window of 2 levels x 3 columns, candidates of 2 and 1 tokens
    visible = lookahead_mask(1, 2, [[10, 11, 12], [13, 14, 15]], [(20, 21), (30,)])
    assert visible.shape == (2 + 6 + 3, 1 + 2 + 6 + 3)
    rows = {name: visible[i, 1:].int().tolist() for i, name in enumerate(
        ["in0", "in1", "w00", "w01", "w02", "w10", "w11", "w12", "c00", "c01", "c10"])}
    assert visible[:, 0].all()  # the cache is seen by every query
    #                  in  in  w00 w01 w02 w10 w11 w12 c00 c01 c10
    assert rows["in0"] == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert rows["in1"] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert rows["w01"] == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]  # level 0 up to its column
    assert rows["w11"] == [1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0]  # level 0 up to column 1, then column 1 upward
    assert rows["w12"] == [1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0]
    assert rows["c01"] == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0]  # its own n-gram, causally
    assert rows["c10"] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]


def test_window_and_pool():
    pool = NgramPool(per_key=2)
    levels = advance_window([[1, 2]], [3, 4], ngram_size=3, pool=pool)  # still filling: no n-gram yet
    assert levels == [[1, 2], [3, 4]] and len(pool) == 0
    levels = advance_window(levels, [5, 6], ngram_size=3, pool=pool)  # full: columns become 3-grams
    assert levels == [[3, 4], [5, 6]]
    assert pool.ngrams == {1: [(3, 5)], 2: [(4, 6)]}
    for ngram in ([1, 7, 7], [1, 8, 8], [1, 3, 5]):
        pool.add(ngram)
    assert pool.candidates(1, 5) == [(3, 5), (8, 8)]  # the latest two, latest first


def test_best_candidate_takes_the_longest_accepted_prefix():
    # the model predicts 4 after the current token; after candidate tokens it predicts as listed
    assert best_candidate(4, [[5, 9], [5, 6], [0, 0]], [(4, 5, 7), (4, 5, 6), (9, 1, 1)]) == (1, 3)
    assert best_candidate(4, [[1]], [(2, 3)]) == (0, 0)
    assert best_candidate(4, [], []) == (-1, 0)


def _sdpa_without_mask(module, query, key, value, attention_mask, **kwargs):
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def test_a_model_that_ignores_the_mask_gets_a_clear_error():
    AttentionInterface.register("sdpa_without_mask", _sdpa_without_mask)
    model = tiny_llama(3, vocab_size=48, hidden=32, weight_std=0.3, eos_token_id=None)
    model.set_attn_implementation("sdpa_without_mask")
    with pytest.raises(ValueError, match="custom attention mask.*sdpa_without_mask"):
        lookahead.generate(model, PROMPT, 5, stop_ids=[])


@pytest.mark.parametrize("bad", [dict(window=0), dict(ngram_size=1), dict(candidates=-1), dict(window=2.5)])
def test_bad_arguments_fail_early(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        lookahead.generate(MODELS["copy"](), PROMPT, 5, **bad)
