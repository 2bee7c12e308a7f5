"""The decoder line-ups the notebooks benchmark: name -> callable(prompt_ids) -> GenerationResult.

Names are what the plots and tables show, so they say what a thing is (and whether it is lossless).
"""

from __future__ import annotations

from functools import partial

from specdec_lab.decoders import autoregressive, draft_then_score, hf, speculative
from specdec_lab.decoders.candidates import DraftModelCandidates, PromptLookupCandidates
from specdec_lab.models import LoadedModel
from specdec_lab.sampling import GREEDY, Sampling

TARGET_AR = "target AR (ours)"


def baseline(target: LoadedModel, draft: LoadedModel | None, max_new_tokens: int, sampling: Sampling = GREEDY) -> dict:
    """Our AR loop and transformers' generate, on the target and (optionally) the draft."""
    line_up = {
        TARGET_AR: partial(autoregressive.generate, target.model, max_new_tokens=max_new_tokens, sampling=sampling),
        "target generate (transformers)": partial(hf.generate, target.model, max_new_tokens=max_new_tokens, sampling=sampling),
    }
    if draft is not None:
        line_up["draft AR (ours)"] = partial(autoregressive.generate, draft.model, max_new_tokens=max_new_tokens, sampling=sampling)
        line_up["draft generate (transformers)"] = partial(hf.generate, draft.model, max_new_tokens=max_new_tokens, sampling=sampling)
    return line_up


def ours_speculative(target: LoadedModel, draft: LoadedModel, k: int, max_new_tokens: int,
                     sampling: Sampling = GREEDY, schedule: str = "constant", confidence_threshold: float = 0.0):
    candidates = DraftModelCandidates(draft.model, k, schedule, confidence_threshold)
    return partial(speculative.generate, target.model, candidates, max_new_tokens=max_new_tokens, sampling=sampling)


def speculative_line_up(
    target: LoadedModel,
    draft: LoadedModel,
    k: int,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    prompt_lookup_k: int = 10,
    universal_draft: LoadedModel | None = None,
) -> dict:
    """AR baseline, our speculative decoder (fixed and adaptive k, prompt lookup), transformers'
    assisted generation (same k; and its defaults), its prompt lookup, the blog's draft-then-score,
    and optionally universal assisted generation with a draft of another tokenizer."""
    gen = partial(hf.generate, target.model, max_new_tokens=max_new_tokens, sampling=sampling)
    line_up = {
        TARGET_AR: partial(autoregressive.generate, target.model, max_new_tokens=max_new_tokens, sampling=sampling),
        f"speculative k={k} (ours)": ours_speculative(target, draft, k, max_new_tokens, sampling),
        f"speculative adaptive k (ours)": ours_speculative(target, draft, k, max_new_tokens, sampling, "heuristic", 0.4),
        f"prompt lookup k={prompt_lookup_k} (ours)": partial(
            speculative.generate, target.model, PromptLookupCandidates(prompt_lookup_k),
            max_new_tokens=max_new_tokens, sampling=sampling),
        f"assisted k={k} (transformers)": partial(
            gen, assistant_model=draft.model, num_assistant_tokens=k,
            num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0),
        "assisted defaults (transformers)": partial(gen, assistant_model=draft.model),
        f"prompt lookup k={prompt_lookup_k} (transformers)": partial(gen, prompt_lookup_num_tokens=prompt_lookup_k),
        "draft-then-score (blog; not lossless)": partial(
            draft_then_score.generate, target.model, draft.model, max_new_tokens=max_new_tokens, sampling=sampling),
    }
    if universal_draft is not None:
        line_up["universal assisted (transformers)"] = partial(
            gen, assistant_model=universal_draft.model, tokenizer=target.tokenizer,
            assistant_tokenizer=universal_draft.tokenizer)
    return line_up


DRAFT_AR = "draft AR (ours)"


def k_sweep_line_up(target: LoadedModel, draft: LoadedModel, k_values: list[int], max_new_tokens: int,
                    sampling: Sampling = GREEDY) -> tuple[dict, dict[str, int]]:
    """AR of target and draft (for the cost ratio c) and our speculative decoder at each k.
    Returns the line-up and decoder name -> k."""
    line_up = {
        TARGET_AR: partial(autoregressive.generate, target.model, max_new_tokens=max_new_tokens, sampling=sampling),
        DRAFT_AR: partial(autoregressive.generate, draft.model, max_new_tokens=max_new_tokens, sampling=sampling),
    }
    k_of = {}
    for k in k_values:
        name = f"speculative k={k} (ours)"
        line_up[name] = ours_speculative(target, draft, k, max_new_tokens, sampling)
        k_of[name] = k
    return line_up, k_of
