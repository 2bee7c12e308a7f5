"""The seed blog's "speculative decoding", reproduced and labelled: draft-then-score.

It generates the whole answer with the small model, then runs the big model once over the text to
score it (mean log-likelihood per token). The big model never chooses a token, so the text is the
draft's text: this is NOT speculative decoding and NOT lossless. The kit runs it beside the real
algorithm so the difference can be seen (token agreement with the target's greedy output).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specdec_lab.decoders import autoregressive
from specdec_lab.decoders.common import as_token_list, clock, forward, new_cache
from specdec_lab.memory import PeakMemory
from specdec_lab.result import GenerationResult
from specdec_lab.sampling import GREEDY, Sampling


def mean_log_likelihood(model, prompt_ids: list[int], answer_ids: list[int]) -> float:
    """Mean log p(answer token | everything before it) under `model`, in one forward pass."""
    logits = forward(model, prompt_ids + answer_ids, new_cache(model), logits_to_keep=len(answer_ids) + 1)
    log_probs = torch.log_softmax(logits[:-1].float(), dim=-1)
    answer = torch.tensor(answer_ids, device=log_probs.device)
    return float(log_probs.gather(1, answer[:, None]).mean())


@torch.inference_mode()
def generate(
    target,
    draft,
    prompt_ids,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    stop_ids: Iterable[int] | None = None,
) -> GenerationResult:
    prompt_ids = as_token_list(prompt_ids)
    device = target.device
    with PeakMemory(device) as memory:
        start = clock(device)
        drafted = autoregressive.generate(draft, prompt_ids, max_new_tokens, sampling, stop_ids)
        score = mean_log_likelihood(target, prompt_ids, drafted.tokens)
        wall_time = clock(device) - start
    return GenerationResult(
        prompt_length=len(prompt_ids),
        tokens=drafted.tokens,
        target_forwards=1,
        draft_forwards=drafted.target_forwards,
        wall_time_s=wall_time,
        time_to_first_token_s=drafted.time_to_first_token_s,
        peak_memory_bytes=max(memory.peak_bytes, drafted.peak_memory_bytes or 0),
        extras={"target_mean_log_likelihood": score, "lossless": False},
    )
