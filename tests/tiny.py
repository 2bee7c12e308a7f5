"""Tiny random causal LMs built from a config in milliseconds, for exact-equality tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS = 3
PROMPT = [1, 5, 6, 7, 8, 9, 10, 11]


def tiny_llama(seed: int = 0, vocab_size: int = 97, layers: int = 2, hidden: int = 64,
               head_std: float | None = None, weight_std: float | None = None,
               eos_token_id: int | None = EOS, bias: bool = False) -> LlamaForCausalLM:
    """fp32, eval mode.

    weight_std re-draws every matrix with that std: larger weights than the default init give
    peaked, less repetitive greedy outputs. head_std re-draws the output head alone: a random model
    at the default init is nearly uniform, a larger std makes it peaked (a draft unlike the target).
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=None if eos_token_id is None else 1, eos_token_id=eos_token_id,
        pad_token_id=None if eos_token_id is None else 0,
        attention_bias=bias, mlp_bias=bias, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        if weight_std is not None:
            for parameter in model.parameters():
                if parameter.dim() > 1:
                    parameter.normal_(0.0, weight_std)
        if head_std is not None:
            model.lm_head.weight.normal_(0.0, head_std)
    return model


TINY_VOCAB = 64  # save_tiny_model: word-level tokens t0..t63


def save_tiny_model(path, seed: int, bias: bool = False) -> str:
    """A tiny random Llama saved with a word-level tokenizer, so `models.load` runs its real path."""
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_llama(seed, vocab_size=TINY_VOCAB, hidden=64, weight_std=0.3, eos_token_id=None, bias=bias)
    model.save_pretrained(path)
    words = Tokenizer(token_models.WordLevel({f"t{i}": i for i in range(TINY_VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0").save_pretrained(path)
    return str(path)


def opinionated_generation_config(model, suppress_tokens=(4, 5)):
    """Give `model` a generation_config like many hub checkpoints ship (sampling, penalties,
    suppressed tokens): a peer that inherits it no longer decodes plain greedy."""
    model.generation_config.update(
        do_sample=True, temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=5.0, no_repeat_ngram_size=2,
        suppress_tokens=list(suppress_tokens), bad_words_ids=[[6]], min_new_tokens=50)
    return model
