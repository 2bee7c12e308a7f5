"""Candidate generators: who proposes the tokens the target verifies.

One small interface (after transformers' candidate_generator.py): `reset(vocab_size)` before a
prompt (the target's output size),
`propose()` up to k tokens with the distributions they were drawn from, `update()` with how many
the target accepted. A draft model and prompt lookup plug in behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec_lab.decoders.common import forward, new_cache, truncate_cache
from specdec_lab.sampling import Sampling, probabilities, sample


@dataclass
class Candidates:
    token_ids: list[int]
    # (len(token_ids), vocab) distributions the tokens were sampled from; None means the proposal
    # is deterministic (q is one-hot on each proposed token), as for prompt lookup.
    probs: torch.Tensor | None = None


class CandidateGenerator(Protocol):
    forwards: int  # model forward passes spent proposing since reset()

    def reset(self, vocab_size: int) -> None: ...

    def propose(self, tokens: list[int], max_candidates: int, sampling: Sampling,
                rng: torch.Generator | None) -> Candidates: ...

    def update(self, tokens: list[int], num_accepted: int, num_proposed: int) -> None: ...


class DraftLength:
    """How many tokens to draft next: fixed, or transformers' heuristic (+2 after a fully
    accepted block, -1 otherwise). Starts from `k` again at every reset."""

    def __init__(self, k: int, schedule: str = "constant"):
        if int(k) < 1:
            raise ValueError(f"draft length k must be >= 1, got {k}")
        if schedule not in ("constant", "heuristic"):
            raise ValueError(f"unknown draft-length schedule {schedule!r}: use 'constant' or 'heuristic'")
        self.initial_k, self.schedule, self.k = int(k), schedule, int(k)

    def reset(self) -> None:
        self.k = self.initial_k

    def update(self, num_accepted: int, num_proposed: int) -> None:
        if self.schedule == "heuristic" and num_proposed > 0:
            self.k = self.k + 2 if num_accepted == num_proposed else max(1, self.k - 1)


class DraftModelCandidates:
    """A small model with the target's tokenizer drafts k tokens autoregressively.

    Its KV cache holds a prefix of the sequence (`cached_length` tokens); `propose` first feeds
    whatever of the sequence is not cached yet (the whole prompt on the first call, then the 1-2
    tokens the target added), so no prefix is ever re-encoded.
    """

    def __init__(self, model, k: int = 5, schedule: str = "constant", confidence_threshold: float = 0.0):
        if not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        self.model = model
        self.length = DraftLength(k, schedule)
        self.confidence_threshold = confidence_threshold
        self.reset(vocab_size=None)

    def reset(self, vocab_size: int | None) -> None:
        # A draft's head may be padded past the target's (same tokenizer, other matrix size):
        # it must never propose an id the target has no row for, so its logits are cut there.
        self.vocab_size = vocab_size
        self.cache = new_cache(self.model)
        self.cached_length = 0
        self.forwards = 0
        self.length.reset()

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        k = min(self.length.k, max_candidates)
        if k < 1:
            return Candidates([], None)
        proposed, distributions = [], []
        pending = tokens[self.cached_length:]
        for _ in range(k):
            logits = forward(self.model, pending, self.cache, logits_to_keep=1)[-1, : self.vocab_size]
            self.forwards += 1
            self.cached_length += len(pending)
            if sampling.greedy:  # greedy verification needs no q: skip the vocabulary-sized work
                token = int(logits.argmax())
                top_probability = float(logits.float().softmax(-1).max()) if self.confidence_threshold else 1.0
            else:
                q = probabilities(logits, sampling)
                token = int(sample(q, rng))
                top_probability = float(q.max())
                distributions.append(q)
            proposed.append(token)
            if top_probability < self.confidence_threshold:
                break  # the draft is unsure: stop here rather than spend forwards on likely rejects
            pending = [token]
        return Candidates(proposed, torch.stack(distributions) if distributions else None)

    def update(self, tokens, num_accepted, num_proposed) -> None:
        # The cache is valid up to the last accepted token; everything after it is dropped.
        self.cached_length = min(self.cached_length, len(tokens) - 1)
        truncate_cache(self.cache, self.cached_length)
        self.length.update(num_accepted, num_proposed)


class PromptLookupCandidates:
    """No model: find the latest earlier occurrence of the sequence's last n-gram (n from
    `max_ngram` down to `min_ngram`) and propose the tokens that followed it."""

    def __init__(self, k: int = 10, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.length = DraftLength(k, "constant")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.forwards = 0

    def reset(self, vocab_size: int | None = None) -> None:
        self.forwards = 0

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        k = min(self.length.k, max_candidates)
        if k < 1:
            return Candidates([])
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            pattern = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # latest match first
                if tokens[start:start + n] == pattern:
                    follow = tokens[start + n:start + n + k]
                    if follow:
                        return Candidates(follow)
        return Candidates([])

    def update(self, tokens, num_accepted, num_proposed) -> None:
        pass
