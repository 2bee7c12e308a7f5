"""Peers: transformers' own `generate` (greedy / sampling, assisted generation, prompt lookup,
universal assisted generation), measured into the same `GenerationResult` as our decoders.

Forward passes are counted with forward pre-hooks on the models, so the peers' tokens per target
forward are measured, not inferred.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from transformers import GenerationConfig

from specdec_lab.decoders.backend import engine
from specdec_lab.decoders.common import DecodingRun, cut_at_stop
from specdec_lab.models.load import quiet_transformers
from specdec_lab.result import GenerationResult
from specdec_lab.sampling import GREEDY, Sampling


class _ForwardCounter:
    def __init__(self, model):
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


class _FirstTokenClock:
    """A streamer that only tells the run when the first generated token arrives."""

    def __init__(self, run: DecodingRun):
        self.run, self.calls = run, 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first put() is the prompt itself
            self.run.first_token_done()

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _generation_configs(own: list[tuple[object, GenerationConfig]]):
    """Give each model its config from `own` as model.generation_config for the call, then restore.

    generate() fills every None field of the config we pass from model.generation_config (the
    model's generation_config.json: do_sample, repetition_penalty, suppress_tokens, ...), and the
    assistant's generate() fills them again from the assistant's. Explicit neutral values cannot
    stop that: for suppress_tokens, bad_words_ids, min_new_tokens, eos_token_id ... the neutral value
    is None, the very value that gets filled in. So a fresh config holding only our settings stands
    in for each model's own. Restoring the originals (on errors too) also drops what transformers
    writes into the assistant's config (the heuristic num_assistant_tokens, universal assisted's
    repetition_penalty = None).
    """
    saved = [(model, model.generation_config) for model, _ in own]
    try:
        for model, config in own:
            model.generation_config = config
        yield
    finally:
        for model, config in reversed(saved):
            model.generation_config = config


@torch.inference_mode()
def generate(
    model,
    prompt_ids,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    stop_ids: Iterable[int] | None = None,
    assistant_model=None,
    num_assistant_tokens: int | None = None,
    num_assistant_tokens_schedule: str | None = None,
    assistant_confidence_threshold: float | None = None,
    prompt_lookup_num_tokens: int | None = None,
    tokenizer=None,
    assistant_tokenizer=None,
) -> GenerationResult:
    """`model.generate` with exactly our settings: no setting from the model's (or the assistant's)
    generation_config.json, such as a repetition penalty, sneaks in (see `_generation_configs`)."""
    for role, candidate in (("model", model), ("assistant_model", assistant_model)):
        if candidate is not None and engine(candidate) != "transformers":
            raise ValueError(f"transformers' generate needs a transformers model, but {role} runs on {engine(candidate)}: "
                             "use the kit's decoders (they run on either engine) or load the model with models.load")
    run = DecodingRun(model, prompt_ids, max_new_tokens, stop_ids)
    stop_ids = sorted(run.stop_ids)
    special_ids = dict(eos_token_id=stop_ids or None, pad_token_id=stop_ids[0] if stop_ids else 0)
    config = GenerationConfig(
        **special_ids,
        max_new_tokens=max_new_tokens,
        do_sample=not sampling.greedy,
        temperature=sampling.temperature if not sampling.greedy else None,
        top_k=sampling.top_k if not sampling.greedy else None,
        top_p=sampling.top_p if not sampling.greedy else None,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens,
    )
    own = [(model, GenerationConfig(**special_ids))]
    extra = {}
    if assistant_model is not None:
        extra["assistant_model"] = assistant_model
        # transformers reads these from the *assistant's* generation_config (passed to generate()
        # they are silently ignored); None leaves transformers' defaults
        own.append((assistant_model, GenerationConfig(
            **special_ids, num_assistant_tokens=num_assistant_tokens,
            num_assistant_tokens_schedule=num_assistant_tokens_schedule,
            assistant_confidence_threshold=assistant_confidence_threshold)))
    if assistant_tokenizer is not None:  # universal assisted generation: different tokenizers
        extra.update(tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer)
    if not sampling.greedy:
        torch.manual_seed(sampling.seed)  # transformers samples from the global generator

    # Assisted generation and prompt lookup put their first token to the streamer only after the
    # first draft-and-verify round, not after the prefill as ours do: another event, so not timed.
    drafting = assistant_model is not None or prompt_lookup_num_tokens is not None
    streamer = None if drafting else _FirstTokenClock(run)

    input_ids = torch.tensor([run.prompt_ids], device=run.device)
    target_counter = _ForwardCounter(model)
    draft_counter = _ForwardCounter(assistant_model) if assistant_model is not None else None
    try:
        with quiet_transformers(), _generation_configs(own), run:
            output = model.generate(input_ids, generation_config=config, streamer=streamer, **extra)
    finally:
        target_counter.remove()
        if draft_counter is not None:
            draft_counter.remove()

    if drafting:
        run.time_to_first_token_s = float("nan")
    return run.result(
        output[0, len(run.prompt_ids):].tolist(),
        target_forwards=target_counter.count,
        draft_forwards=draft_counter.count if draft_counter is not None else 0,
    )


@torch.inference_mode()
def generate_batch(model, prompts, max_new_tokens: int, stop_ids: Iterable[int] | None = None) -> list[GenerationResult]:
    """transformers' greedy `generate` on a left-padded batch (an attention mask hides the padding): the AR
    peer of the kit's batched decoders. transformers has no batched speculation (assisted generation
    and prompt lookup take one sequence), so it is the only peer at batch > 1. Every row's wall time and
    target forwards are the batch's: `generate` returns all rows together, and a finished row stays in the
    batch (padded) until the last one ends."""
    if engine(model) != "transformers":
        raise ValueError(f"transformers' generate needs a transformers model, but this one runs on {engine(model)}")
    runs = [DecodingRun(model, prompt, max_new_tokens, stop_ids) for prompt in prompts]
    if not runs:
        raise ValueError("an empty batch: give at least one prompt")
    stop = sorted(runs[0].stop_ids)
    pad = stop[0] if stop else 0
    width = max(len(run.prompt_ids) for run in runs)
    input_ids = torch.tensor([[pad] * (width - len(run.prompt_ids)) + run.prompt_ids for run in runs], device=model.device)
    attention_mask = torch.tensor([[0] * (width - len(run.prompt_ids)) + [1] * len(run.prompt_ids) for run in runs],
                                  device=model.device)
    special_ids = dict(eos_token_id=stop or None, pad_token_id=pad)
    config = GenerationConfig(**special_ids, max_new_tokens=max_new_tokens, do_sample=False)
    counter = _ForwardCounter(model)
    batch = runs[0]  # one clock and memory sampler for the whole batch
    try:
        with quiet_transformers(), _generation_configs([(model, GenerationConfig(**special_ids))]), batch:
            output = model.generate(input_ids, attention_mask=attention_mask, generation_config=config)
    finally:
        counter.remove()
    results = []
    for row, run in enumerate(runs):
        tokens, _ = cut_at_stop(output[row, width:].tolist(), run.stop_ids)
        results.append(GenerationResult(
            prompt_length=len(run.prompt_ids), tokens=tokens, wall_time_s=batch.wall_time_s,
            time_to_first_token_s=float("nan"), peak_memory_bytes=batch.peak_memory_bytes,
            target_forwards=counter.count, extras={"batch_size": len(runs), "batch_forwards": counter.count,
                                                   "batch_wall_time_s": batch.wall_time_s}))
    return results
