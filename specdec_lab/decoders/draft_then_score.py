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
from specdec_lab.decoders.backend import open_sequence, stop_token_ids
from specdec_lab.decoders.common import DecodingRun
from specdec_lab.quality import nll_from_logits
from specdec_lab.result import UNVERIFIED_DRAFT, GenerationResult
from specdec_lab.sampling import GREEDY, Sampling


@torch.inference_mode()
def generate(
    target,
    draft,
    prompt_ids,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    stop_ids: Iterable[int] | None = None,
) -> GenerationResult:
    """The draft generates the whole answer; the target scores it once (mean log-likelihood per token)."""
    run = DecodingRun(target, prompt_ids, max_new_tokens, stop_ids)
    rng = None if sampling.greedy else sampling.generator(draft.device)
    draft_stop_ids = stop_token_ids(draft) if stop_ids is None else frozenset(stop_ids)  # the text is the draft's
    with run:
        tokens = autoregressive.decode_tokens(draft, run.prompt_ids, max_new_tokens, sampling, rng, draft_stop_ids,
                                              on_first_token=run.first_token_done)
        # one pass over prompt + text; the last len(tokens) + 1 rows predict the text's tokens
        logits = open_sequence(target).forward(run.prompt_ids + tokens, keep=len(tokens) + 1)[:-1]
        score = -float(nll_from_logits(logits, tokens).mean())
    # The target never decodes: its one pass scores finished text, so it is reported as a scoring
    # pass, not as a forward that yielded tokens (tokens per target forward is not defined here).
    return run.result(
        tokens,
        target_forwards=0,
        draft_forwards=len(tokens),  # the draft's prefill and one pass per further token
        extras={"target_scoring_passes": 1, "target_mean_log_likelihood": score},
        token_origins=[UNVERIFIED_DRAFT] * len(tokens),
        token_steps=list(range(len(tokens))),  # the draft's steps: the target verified none of them
    )
