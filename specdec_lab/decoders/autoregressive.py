"""Plain autoregressive decoding with a KV cache: the baseline every speedup is measured against.

Read top to bottom: prefill the prompt, then decode one token at a time (gpt-fast's shape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from specdec_lab.decoders.backend import Sequence, open_sequence
from specdec_lab.decoders.common import DecodingRun
from specdec_lab.result import TARGET, GenerationResult
from specdec_lab.sampling import GREEDY, Sampling, next_token


def prefill(sequence: Sequence, prompt_ids: list[int]) -> torch.Tensor:
    """Fill the cache with the prompt; return the logits for the first new token."""
    return sequence.forward(prompt_ids, keep=1)[-1]


def decode_one_token(sequence: Sequence, token: int) -> torch.Tensor:
    """Feed one token; return the logits for the token after it."""
    return sequence.forward([token], keep=1)[-1]


def decode_tokens(model, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling, rng,
                  stop_ids: frozenset[int], on_first_token: Callable[[], None] = lambda: None) -> list[int]:
    """The AR loop itself: prefill, then one token per forward until a stop token or max_new_tokens."""
    sequence = open_sequence(model)
    token = next_token(prefill(sequence, prompt_ids), sampling, rng)
    on_first_token()
    tokens = [token]
    while len(tokens) < max_new_tokens and token not in stop_ids:
        token = next_token(decode_one_token(sequence, token), sampling, rng)
        tokens.append(token)
    return tokens


@torch.inference_mode()
def generate(
    model,
    prompt_ids,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    stop_ids: Iterable[int] | None = None,
) -> GenerationResult:
    """Greedy or sampled decoding until a stop token or `max_new_tokens`."""
    run = DecodingRun(model, prompt_ids, max_new_tokens, stop_ids)
    rng = None if sampling.greedy else sampling.generator(run.device)
    with run:
        tokens = decode_tokens(model, run.prompt_ids, max_new_tokens, sampling, rng, run.stop_ids,
                               on_first_token=run.first_token_done)
    return run.result(
        tokens,
        accepted_per_step=[0] * (len(tokens) - 1),
        proposed_per_step=[0] * (len(tokens) - 1),
        target_forwards=len(tokens),  # the prefill yields the first token, then one pass per token
        forward_tokens=[1] * (len(tokens) - 1),
        token_origins=[TARGET] * len(tokens),
        token_steps=list(range(len(tokens))),
    )
