"""The profiles' own architectures through every decoder: Gemma 2 (gpu-gemma2: alternating sliding-window
and global layers, soft-capped logits) and Qwen 2 (cpu: attention biases, a tied head), tiny and random,
fp32. Greedy decoding with any method must equal AR token for token, on the caches these architectures
build (Gemma 2's sliding-window layers beside its global ones), not only on the Llama the other tests use.
Past its window, a sliding layer cannot be rolled back: the sequence refuses to grow there."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tiny import DEVICE, PROMPT
from specdec_lab.decoders import autoregressive, batched, jacobi, lookahead, speculative
from specdec_lab.decoders.backend import open_sequence
from specdec_lab.decoders.batched import BatchedDraft
from specdec_lab.decoders.candidates import (DraftModelCandidates, DraftTreeCandidates, PromptLookupCandidates,
                                             PromptLookupTreeCandidates)
from specdec_lab.sampling import GREEDY

WINDOW = 96  # Gemma 2's sliding window, in tokens (4096 in gemma-2-9b-it): every test here stays inside it


def tiny(architecture: str, seed: int, layers: int = 2):
    """A random model of `architecture` whose greedy text varies (not one token repeated), fp32, eval, on the
    tests' device. Gemma 2 scales its embeddings by sqrt(hidden): its weights are drawn smaller, its queries
    and keys larger (attention that picks, rather than averages)."""
    torch.manual_seed(seed)
    shared = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if architecture == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(**shared, head_dim=16, query_pre_attn_scalar=16,
                                               sliding_window=WINDOW, attn_implementation="eager"))
        std, query_key_std = 0.05, 0.5
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shared, tie_word_embeddings=True))
        std = query_key_std = 0.3
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, query_key_std if name.endswith(("q_proj.weight", "k_proj.weight")) else std)
    return model.float().eval().to(DEVICE)


@pytest.fixture(scope="module", params=["gemma2", "qwen2"])
def pair(request):
    return tiny(request.param, seed=0), tiny(request.param, seed=1, layers=1)


def ar(model, prompt=PROMPT, max_new_tokens=40):
    return autoregressive.generate(model, prompt, max_new_tokens, stop_ids=[]).tokens


def test_the_texts_vary_so_that_equality_means_something(pair):
    target, _ = pair
    assert len(set(ar(target))) >= 10


def test_a_sequence_refuses_to_grow_past_gemma_2s_sliding_window():
    """Past its window a sliding layer has dropped the cells a rollback would need: refused, not decoded wrong."""
    sequence = open_sequence(tiny("gemma2", seed=0))
    sequence.forward([5] * (WINDOW - 2), keep=1)
    with pytest.raises(ValueError, match=f"past the model's sliding window of {WINDOW}: use shorter prompts"):
        sequence.forward([5, 6], keep=1)


@pytest.mark.parametrize("make", [
    lambda draft: DraftModelCandidates(draft, 4),
    lambda draft: DraftTreeCandidates(draft, depth=4, branching=2, beam=3, nodes=8),
    lambda draft: PromptLookupCandidates(k=6, max_ngram=2),
    lambda draft: PromptLookupTreeCandidates(k=6, branches=3, nodes=12),
], ids=["draft chain", "draft tree", "prompt lookup", "prompt-lookup tree"])
def test_speculative_sources_equal_ar(pair, make):
    target, draft = pair
    repetitive = PROMPT + PROMPT[2:]  # gives prompt lookup matches to propose
    assert speculative.generate(target, make(draft), repetitive, 40, GREEDY, stop_ids=[]).tokens == ar(target, repetitive)


def test_jacobi_and_lookahead_equal_ar(pair):
    target, _ = pair
    assert jacobi.generate(target, PROMPT, 40, block_size=6, stop_ids=[]).tokens == ar(target)
    assert lookahead.generate(target, PROMPT, 40, window=4, ngram_size=3, stop_ids=[]).tokens == ar(target)


def test_a_batch_of_ragged_prompts_decodes_each_row_as_alone(pair):
    target, draft = pair
    prompts = [PROMPT, PROMPT[:3], PROMPT + [12, 13, 14, 15, 16]]
    alone = [ar(target, prompt, 24) for prompt in prompts]
    assert [result.tokens for result in batched.generate_ar(target, prompts, 24, stop_ids=[])] == alone
    assert [result.tokens for result in
            batched.generate_speculative(target, BatchedDraft(draft, 3), prompts, 24, stop_ids=[])] == alone
