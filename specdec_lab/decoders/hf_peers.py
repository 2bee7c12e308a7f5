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

from specdec_lab.decoders.common import DecodingRun
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
def _assistant_settings(assistant, num_tokens: int | None, schedule: str | None, threshold: float | None):
    """transformers reads these from the *assistant's* generation_config (passed to generate()
    they are silently ignored), so set them there for the call and restore them after."""
    if assistant is None:
        yield
        return
    config = assistant.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {name: getattr(config, name, None) for name in names}
    for name, value in zip(names, (num_tokens, schedule, threshold)):
        if value is not None:
            setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


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
    """`model.generate` with exactly our settings (a fresh GenerationConfig, so no defaults from
    the model's generation_config.json such as a repetition penalty sneak in)."""
    run = DecodingRun(model, prompt_ids, max_new_tokens, stop_ids)
    stop_ids = sorted(run.stop_ids)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not sampling.greedy,
        temperature=sampling.temperature if not sampling.greedy else None,
        top_k=sampling.top_k if not sampling.greedy else None,
        top_p=sampling.top_p if not sampling.greedy else None,
        eos_token_id=stop_ids or None,
        pad_token_id=stop_ids[0] if stop_ids else 0,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens,
    )
    extra = {}
    if assistant_model is not None:
        extra["assistant_model"] = assistant_model
    if assistant_tokenizer is not None:  # universal assisted generation: different tokenizers
        extra.update(tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer)
    if not sampling.greedy:
        torch.manual_seed(sampling.seed)  # transformers samples from the global generator

    input_ids = torch.tensor([run.prompt_ids], device=run.device)
    target_counter = _ForwardCounter(model)
    draft_counter = _ForwardCounter(assistant_model) if assistant_model is not None else None
    try:
        with quiet_transformers(), _assistant_settings(assistant_model, num_assistant_tokens,
                                                        num_assistant_tokens_schedule, assistant_confidence_threshold):
            with run:
                output = model.generate(input_ids, generation_config=config, streamer=_FirstTokenClock(run), **extra)
    finally:
        target_counter.remove()
        if draft_counter is not None:
            draft_counter.remove()

    return run.result(
        output[0, len(run.prompt_ids):].tolist(),
        target_forwards=target_counter.count,
        draft_forwards=draft_counter.count if draft_counter is not None else 0,
    )
