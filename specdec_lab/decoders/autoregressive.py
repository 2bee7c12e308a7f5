"""Plain autoregressive decoding with a KV cache: the baseline every speedup is measured against.

Read top to bottom: prefill the prompt, then decode one token at a time (gpt-fast's shape).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specdec_lab.decoders.common import (
    as_token_list, check_max_new_tokens, clock, forward, new_cache, stop_token_ids,
)
from specdec_lab.memory import PeakMemory
from specdec_lab.result import GenerationResult
from specdec_lab.sampling import GREEDY, Sampling, next_token


def prefill(model, prompt_ids: list[int], cache) -> torch.Tensor:
    """Fill the cache with the prompt; return the logits for the first new token."""
    return forward(model, prompt_ids, cache, logits_to_keep=1)[-1]


def decode_one_token(model, token: int, cache) -> torch.Tensor:
    """Feed one token; return the logits for the token after it."""
    return forward(model, [token], cache, logits_to_keep=1)[-1]


@torch.inference_mode()
def generate(
    model,
    prompt_ids,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    stop_ids: Iterable[int] | None = None,
) -> GenerationResult:
    """Greedy or sampled decoding until a stop token or `max_new_tokens`."""
    prompt_ids = as_token_list(prompt_ids)
    check_max_new_tokens(max_new_tokens)
    stop_ids = stop_token_ids(model) if stop_ids is None else frozenset(stop_ids)
    device = model.device
    rng = None if sampling.greedy else sampling.generator(device)
    cache = new_cache(model)

    with PeakMemory(device) as memory:
        start = clock(device)
        token = next_token(prefill(model, prompt_ids, cache), sampling, rng)
        first_token_time = clock(device) - start
        tokens = [token]
        while len(tokens) < max_new_tokens and token not in stop_ids:
            token = next_token(decode_one_token(model, token, cache), sampling, rng)
            tokens.append(token)
        wall_time = clock(device) - start

    return GenerationResult(
        prompt_length=len(prompt_ids),
        tokens=tokens,
        accepted_per_step=[0] * (len(tokens) - 1),
        proposed_per_step=[0] * (len(tokens) - 1),
        target_forwards=len(tokens),  # the prefill yields the first token, then one pass per token
        wall_time_s=wall_time,
        time_to_first_token_s=first_token_time,
        peak_memory_bytes=memory.peak_bytes,
    )
