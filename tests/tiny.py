"""Tiny random causal LMs built from a config in milliseconds, for exact-equality tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

EOS = 3


def tiny_llama(seed: int = 0, vocab_size: int = 97, layers: int = 2, hidden: int = 64,
               head_std: float | None = None) -> LlamaForCausalLM:
    """fp32, eval mode. head_std re-draws the output head with that std: a random model at the
    default init is nearly uniform, a larger std makes it peaked (a draft unlike the target)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=EOS, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    if head_std is not None:
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, head_std)
    return model


PROMPT = [1, 5, 6, 7, 8, 9, 10, 11]
