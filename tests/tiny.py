"""Tiny random causal LMs built from a config in milliseconds, for exact-equality tests."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# `make gpu-check`: the tiny models on a GPU, so the decoders' equality tests run where the gpu profile decodes.
DEVICE = torch.device(os.environ.get("SPECDEC_TEST_DEVICE", "cpu"))
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
    return model.to(DEVICE)


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


def copy_llama(lag: int, vocab_size: int = 32, scale: float = 30.0) -> LlamaForCausalLM:
    """A hand-built one-layer Llama (fp32, eval) whose next token is the one `lag` positions back:
    it continues any prompt by repeating the prompt's last `lag` tokens.

    The single attention head has constant queries and keys (biases only), so RoPE alone decides
    where it looks: exactly `lag - 1` positions before the current one. It reads each token's
    position from the KV cache, so a cache entry too many or too few changes its output. `scale`
    is the logit gap between the copied token and every other one (30: greedy and certain;
    2: a soft distribution, peaked on a different token at every position).
    """
    head_dim, hidden, theta = 32, 2 * vocab_size, 100.0
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, attention_bias=True,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = LlamaForCausalLM(config).float().eval()
    identity = torch.eye(vocab_size)
    half = head_dim // 2
    # the rotary angle of pair f at distance d is d * theta**(-f/half): turning the keys by
    # (lag - 1) of those angles makes every pair's score peak together at distance lag - 1
    angle = (lag - 1) * theta ** (-torch.arange(half, dtype=torch.float) / half)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in (model.model.norm, model.model.layers[0].input_layernorm,
                     model.model.layers[0].post_attention_layernorm):
            norm.weight.fill_(1.0)  # the MLP stays zero: it adds nothing
        model.model.embed_tokens.weight[:, :vocab_size] = identity  # residual: one-hot token in the first half
        attention = model.model.layers[0].self_attn
        attention.q_proj.bias[:half] = 16.0
        attention.k_proj.bias[:half] = 16.0 * torch.cos(angle)
        attention.k_proj.bias[half:] = 16.0 * torch.sin(angle)
        attention.v_proj.weight[:vocab_size, :vocab_size] = identity
        attention.o_proj.weight[vocab_size:, :vocab_size] = identity  # the attended token, second half
        # residual = token (1) + attended token (sqrt(hidden), from the normed input); after the final
        # norm the latter is hidden / sqrt(1 + hidden): the head reads it, with a logit gap of `scale`
        model.lm_head.weight[:, vocab_size:] = identity * scale * (1 + hidden) ** 0.5 / hidden
    return model.to(DEVICE)


# --- the same tiny models on llama.cpp: written to GGUF as llama.cpp's own converter would ------------------

def _permute_for_llama_cpp(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' Llama rotates the two halves of a head (rotate_half); llama.cpp's llama graph
    rotates adjacent pairs. Its converter reorders the rows of q and k (and their biases) so both
    compute the same attention: the permutation of convert_hf_to_gguf.LlamaModel.permute."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def save_gguf(model: LlamaForCausalLM, path) -> str:
    """Write a (tiny, fp32) transformers Llama as an F32 GGUF file llama.cpp loads: same weights,
    same vocabulary size and ids, a placeholder SentencePiece vocabulary (the kit passes ids, never text)."""
    import gguf

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = config.vocab_size
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>"] + [f"t{i}" for i in range(4, vocab)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.BYTE]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens[:vocab])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types((types + [gguf.TokenType.NORMAL] * vocab)[:vocab])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(config.eos_token_id if config.eos_token_id is not None else 2)

    def add(name: str, tensor: torch.Tensor) -> None:
        writer.add_tensor(name, tensor.detach().float().cpu().contiguous().numpy())

    add("token_embd.weight", model.model.embed_tokens.weight)
    for index, layer in enumerate(model.model.layers):
        attention, mlp, block = layer.self_attn, layer.mlp, f"blk.{index}"
        add(f"{block}.attn_norm.weight", layer.input_layernorm.weight)
        for name, projection, permute_heads in (("attn_q", attention.q_proj, heads), ("attn_k", attention.k_proj, kv_heads),
                                                ("attn_v", attention.v_proj, None), ("attn_output", attention.o_proj, None)):
            for kind in ("weight", "bias"):
                tensor = getattr(projection, kind)
                if tensor is not None:
                    add(f"{block}.{name}.{kind}", _permute_for_llama_cpp(tensor, permute_heads) if permute_heads else tensor)
        add(f"{block}.ffn_norm.weight", layer.post_attention_layernorm.weight)
        add(f"{block}.ffn_gate.weight", mlp.gate_proj.weight)
        add(f"{block}.ffn_up.weight", mlp.up_proj.weight)
        add(f"{block}.ffn_down.weight", mlp.down_proj.weight)
    add("output_norm.weight", model.model.norm.weight)
    add("output.weight", model.lm_head.weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def on_llama_cpp(model: LlamaForCausalLM, folder):
    """The tiny model as a llama.cpp engine (one thread), through a GGUF file in `folder`."""
    from specdec_lab.models import llama_cpp

    Path(folder).mkdir(parents=True, exist_ok=True)
    return llama_cpp.load(save_gguf(model, Path(folder) / "model.gguf"), threads=1, context_tokens=1024)
