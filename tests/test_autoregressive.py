import math

import pytest
import torch

from specdec_lab.decoders import autoregressive, hf_peers
from specdec_lab.sampling import Sampling
from tiny import PROMPT, opinionated_generation_config, tiny_llama


def test_greedy_equals_transformers_generate_in_fp32():
    model = tiny_llama()
    ours = autoregressive.generate(model, PROMPT, 40, stop_ids=[])
    reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert ours.tokens == reference
    assert ours.target_forwards == 40 and ours.num_tokens == 40


def test_peer_wrapper_matches_and_counts_forwards():
    model = tiny_llama()
    ours = autoregressive.generate(model, PROMPT, 25, stop_ids=[])
    peer = hf_peers.generate(model, PROMPT, 25, stop_ids=[])
    assert peer.tokens == ours.tokens
    assert peer.target_forwards == 25  # one prefill + 24 decode steps, counted by a hook
    assert 0 < peer.time_to_first_token_s <= peer.wall_time_s


PEER_MODES = {
    "generate": lambda: {},
    "prompt_lookup": lambda: dict(prompt_lookup_num_tokens=3),
    "assisted": lambda: dict(assistant_model=tiny_llama(seed=1), num_assistant_tokens=3),
}


@pytest.mark.parametrize("mode", PEER_MODES)
def test_peers_ignore_the_models_generation_config(mode):
    model = tiny_llama()
    ours = autoregressive.generate(model, PROMPT, 25, stop_ids=[])
    extra = PEER_MODES[mode]()
    models = [each for each in (model, extra.get("assistant_model")) if each is not None]
    for each in models:  # sampling, penalties, suppressed tokens, EOS 3: all must be ignored
        opinionated_generation_config(each, suppress_tokens=ours.tokens[:2])
    before = [(each.generation_config, each.generation_config.to_dict()) for each in models]
    peer = hf_peers.generate(model, PROMPT, 25, stop_ids=[], **extra)
    assert peer.tokens == ours.tokens
    assert [(each.generation_config, each.generation_config.to_dict()) for each in models] == before


def test_generation_configs_come_back_when_generate_fails():
    model, draft = tiny_llama(), tiny_llama(seed=1, vocab_size=50)
    before = [model.generation_config, draft.generation_config]
    with pytest.raises(ValueError, match="different tokenizers"):  # raised inside model.generate
        hf_peers.generate(model, PROMPT, 5, assistant_model=draft)
    assert model.generation_config is before[0] and draft.generation_config is before[1]


@pytest.mark.parametrize("mode", ["prompt_lookup", "assisted"])
def test_drafting_peers_do_not_report_a_time_to_first_token(mode):
    # their streamer sees the first token only after a draft-and-verify round, not after prefill
    peer = hf_peers.generate(tiny_llama(), PROMPT, 10, stop_ids=[], **PEER_MODES[mode]())
    assert math.isnan(peer.time_to_first_token_s) and peer.wall_time_s > 0


def test_stops_at_eos_and_keeps_it():
    model = tiny_llama()
    free = autoregressive.generate(model, PROMPT, 30, stop_ids=[])
    stop = free.tokens[5]
    cut = autoregressive.generate(model, PROMPT, 30, stop_ids=[stop])
    assert cut.tokens == free.tokens[: free.tokens.index(stop) + 1]


def test_sampling_is_reproducible_with_a_seed_and_varies_without():
    model = tiny_llama()
    a = autoregressive.generate(model, PROMPT, 20, Sampling(temperature=1.0, seed=7), stop_ids=[])
    b = autoregressive.generate(model, PROMPT, 20, Sampling(temperature=1.0, seed=7), stop_ids=[])
    c = autoregressive.generate(model, PROMPT, 20, Sampling(temperature=1.0, seed=8), stop_ids=[])
    assert a.tokens == b.tokens and a.tokens != c.tokens


@pytest.mark.parametrize("bad, message", [
    (dict(prompt_ids=[]), "empty prompt"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
])
def test_bad_input_is_named(bad, message):
    arguments = dict(prompt_ids=PROMPT, max_new_tokens=5) | bad
    with pytest.raises(ValueError, match=message):
        autoregressive.generate(tiny_llama(), **arguments)


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=-1), "temperature"), (dict(top_k=-2), "top_k"), (dict(top_p=0), "top_p"),
])
def test_bad_sampling_settings_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**bad)
