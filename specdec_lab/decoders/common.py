"""Small pieces every decoder shares: clocks, prompt checks, stop tokens, and `DecodingRun`, the
set-up, timing and result construction around every decode loop. The forward pass and the cache
are the engine's (`backend`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from specdec_lab.decoders.backend import stop_token_ids
from specdec_lab.memory import PeakMemory
from specdec_lab.result import GenerationResult


def clock(device: torch.device) -> float:
    """Wall clock that waits for queued GPU work first, so timings mean what they say."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def as_token_list(prompt_ids) -> list[int]:
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.reshape(-1).tolist()
    prompt_ids = [int(token) for token in prompt_ids]
    if not prompt_ids:
        raise ValueError("empty prompt: a decoder needs at least one prompt token (e.g. the BOS token)")
    return prompt_ids


def check_max_new_tokens(max_new_tokens: int) -> None:
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def cut_at_stop(tokens: list[int], stop_ids: Iterable[int]) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first stop token; say whether one was found."""
    stop_ids = set(stop_ids)
    for position, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: position + 1], True
    return tokens, False


@dataclass
class Provenance:
    """Where each generated token came from, built beside the tokens a step at a time:

        provenance.add(step, [DRAFT_MODEL, DRAFT_MODEL, CORRECTION])  # what step `step` yielded
        run.result(tokens, **provenance.cut(len(tokens)))
    """

    origins: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)

    def add(self, step: int, origins: list[str]) -> None:
        self.origins += origins
        self.steps += [step] * len(origins)

    def cut(self, length: int) -> dict:
        """The result fields for the first `length` tokens (a stop token or max_new_tokens cut the rest)."""
        return {"token_origins": self.origins[:length], "token_steps": self.steps[:length]}


@dataclass
class DecodingRun:
    """Everything around a decode loop, done once for every decoder:

        run = DecodingRun(model, prompt_ids, max_new_tokens, stop_ids)
        with run:                        # starts the clock and the peak-memory sampler
            ... prefill ...
            run.first_token_done()       # time to first token
            ... decode ...
        return run.result(tokens, target_forwards=..., ...)

    The prompt is checked and turned into a list of ints, `max_new_tokens` checked, and the stop ids
    default to the model's generation_config.eos_token_id.
    """

    model: object
    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: frozenset[int] | None = None
    wall_time_s: float = field(default=0.0, init=False)
    time_to_first_token_s: float = field(default=0.0, init=False)
    peak_memory_bytes: int | None = field(default=None, init=False)

    def __post_init__(self):
        self.prompt_ids = as_token_list(self.prompt_ids)
        check_max_new_tokens(self.max_new_tokens)
        self.stop_ids = stop_token_ids(self.model) if self.stop_ids is None else frozenset(self.stop_ids)
        self.device = self.model.device

    def __enter__(self) -> "DecodingRun":
        self._memory = PeakMemory(self.device).__enter__()
        self._start = clock(self.device)
        return self

    def first_token_done(self) -> None:
        self.time_to_first_token_s = clock(self.device) - self._start

    def __exit__(self, *exc) -> None:
        self.wall_time_s = clock(self.device) - self._start
        self._memory.__exit__(*exc)
        self.peak_memory_bytes = self._memory.peak_bytes

    def result(self, tokens: list[int], **measured) -> GenerationResult:
        """The result record: this run's prompt length, times and memory, plus what the decoder
        counted (target_forwards, accepted_per_step, ...)."""
        return GenerationResult(
            prompt_length=len(self.prompt_ids), tokens=tokens, wall_time_s=self.wall_time_s,
            time_to_first_token_s=self.time_to_first_token_s, peak_memory_bytes=self.peak_memory_bytes, **measured)
