"""Lookahead decoding (Fu et al., ICML 2024): Jacobi iteration whose trajectory feeds a pool of
n-grams, and verification of the pool's n-grams, in the same forward pass. Greedy and lossless.

One forward pass holds three branches that a 4D attention mask keeps apart:

- **input**: the tokens the KV cache lacks (the whole prompt on the first step, then the tokens
  accepted by the last step), causal as usual. The last of them is the "current" token.
- **lookahead branch**: a window of W columns and up to N-1 levels, the last Jacobi iterations.
  Token (level l, column j) stands at position j + l + 1 after the current token and sees the
  input, level 0 up to column j, and levels 1..l of column j: a run of consecutive positions, so
  its prediction is a Jacobi update of position j + l + 2. The newest level's predictions become a
  new level and the oldest level is dropped. Column j then spells an N-gram (levels 0..N-2 at j,
  then the new token at j), which goes into the pool under its first token.
- **verification branch**: up to G pool n-grams that start with the current token, each seen
  causally within itself at positions 1..N-1 after the current token.

Verification is greedy speculative verification of each n-gram: the one with the longest prefix
equal to the model's own argmax wins, and its accepted tokens plus the model's next token are
appended, at least one token a step (as AR). Only the input's cache entries are kept: the accepted
n-gram tokens are fed again, as input, in the next pass (their entries in this pass sat among
other branches; recomputing a few input tokens is nearly free where T(n) is flat, and any cache
type supports it).

What the model must do: honour a custom attention mask and explicit position ids (transformers'
Llama, Qwen2, Mistral, Gemma and most decoder-only models with sdpa or eager attention; llama.cpp,
where the mask becomes sequence ids: see `models.llama_cpp`). A one-time probe per model checks it
and raises a clear error otherwise.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import torch

from specdec_lab.decoders.backend import Sequence as KVSequence, engine, open_sequence, vocab_size
from specdec_lab.decoders.common import DecodingRun, Provenance, cut_at_stop
from specdec_lab.method import LookaheadConfig
from specdec_lab.result import CORRECTION, LOOKAHEAD_NGRAM, TARGET, GenerationResult
from specdec_lab.sampling import greedy_tokens


# --- the n-gram pool --------------------------------------------------------------------------------

@dataclass
class NgramPool:
    """N-grams from the lookahead branch, keyed by their first token; the latest `per_key` of each
    key are kept (a repeated n-gram moves to the back), and the latest are verified first."""

    per_key: int
    ngrams: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)

    def add(self, ngram: Sequence[int]) -> None:
        key, continuation = ngram[0], tuple(ngram[1:])
        entries = self.ngrams.setdefault(key, [])
        if continuation in entries:
            entries.remove(continuation)
        entries.append(continuation)
        del entries[:-self.per_key]

    def candidates(self, token: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` continuations of `token`, the latest first."""
        return self.ngrams.get(token, [])[::-1][:count]

    def __len__(self) -> int:
        return sum(len(entries) for entries in self.ngrams.values())


# --- the lookahead window ---------------------------------------------------------------------------

def window_positions(levels: list[list[int]]) -> list[int]:
    """Offset after the current token of every window token, level by level: (l, j) -> j + l + 1."""
    return [j + l + 1 for l, level in enumerate(levels) for j in range(len(level))]


def advance_window(levels: list[list[int]], newest_predictions: list[int], ngram_size: int,
                   pool: NgramPool) -> list[list[int]]:
    """One Jacobi iteration of the window: the newest level's predictions become a new level. Once
    the window holds N-1 levels, each column's N-gram goes into the pool and the oldest level goes."""
    if len(levels) == ngram_size - 1:
        for column, new_token in enumerate(newest_predictions):
            pool.add([level[column] for level in levels] + [new_token])
        levels = levels[1:]
    return [*levels, list(newest_predictions)]


# --- the attention mask -----------------------------------------------------------------------------

def lookahead_mask(cached: int, inputs: int, levels: list[list[int]], candidates: list[Sequence[int]]) -> torch.Tensor:
    """Boolean (query, key) visibility for one pass: `cached` tokens in the cache, then `inputs`
    input tokens, the window (level-major) and the candidate n-grams, in that order."""
    width = len(levels[0]) if levels else 0
    window = sum(len(level) for level in levels)
    queries = inputs + window + sum(len(c) for c in candidates)
    visible = torch.zeros(queries, cached + queries, dtype=torch.bool)
    visible[:, :cached + inputs] = True  # everything sees the cache and the input...
    visible[:inputs, cached:cached + inputs] = torch.ones(inputs, inputs, dtype=torch.bool).tril()  # ...causally

    def column(level: int, j: int) -> int:  # query index of window token (level, j)
        return inputs + level * width + j

    for level in range(len(levels)):
        for j in range(width):
            query = column(level, j)
            visible[query, cached + column(0, 0):cached + column(0, j) + 1] = True  # level 0 up to column j
            for below in range(1, level + 1):
                visible[query, cached + column(below, j)] = True  # the same column, levels 1..level
    start = inputs + window
    for candidate in candidates:
        n = len(candidate)
        visible[start:start + n, cached + start:cached + start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        start += n
    return visible


# --- the probe: does this model honour a custom 4D mask? ----------------------------------------------

_HONOURS_MASK: weakref.WeakSet = weakref.WeakSet()


@torch.inference_mode()
def check_custom_mask_support(model) -> None:
    """Raise ValueError unless `model` honours a custom 4D mask and explicit position ids. Three tokens
    a, b, c at positions 0, 1, 1 where c does not see b must give c the logits of a plain pass over
    a, c; a model that ignores the mask gives c what it computes after a, b instead. Once per model."""
    if model in _HONOURS_MASK:
        return
    a, b, c = (7 * i % vocab_size(model) for i in (1, 2, 3))
    visible = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    problem = None
    try:
        probe = open_sequence(model).forward([a, b, c], keep=[2], positions=[0, 1, 1], visible=visible)[0].float()
    except Exception as error:  # noqa: BLE001 - any failure here means "cannot run lookahead"
        problem = f"it fails with {type(error).__name__}: {error}"
    else:
        without_b = open_sequence(model).forward([a, c], keep=1)[-1].float()
        with_b = open_sequence(model).forward([a, b, c], keep=1)[-1].float()
        if (probe - without_b).norm() > 0.1 * (with_b - without_b).norm():
            problem = "a token it was told not to see changed the output"
    if problem:
        attention = getattr(getattr(model, "config", None), "_attn_implementation", engine(model))
        raise ValueError(
            f"lookahead decoding needs a model that honours a custom attention mask; {type(model).__name__} "
            f"(attention: {attention!r}) does not: {problem}. Load it with attn_implementation='sdpa' or "
            f"'eager', or use Jacobi or speculative decoding instead.")
    _HONOURS_MASK.add(model)


# --- one step and the loop --------------------------------------------------------------------------

def best_candidate(first_prediction: int, predictions: list[list[int]], candidates: list[Sequence[int]]) -> tuple[int, int]:
    """(index, accepted) of the n-gram with the longest prefix equal to the model's argmax: token i
    of a candidate must equal the prediction after token i - 1 (after the current token for i = 0).
    Ties go to the earlier (latest added) n-gram; (-1, 0) without candidates."""
    best, best_accepted = -1, 0
    for index, (candidate, after) in enumerate(zip(candidates, predictions)):
        expected = [first_prediction, *after]
        accepted = 0
        while accepted < len(candidate) and candidate[accepted] == expected[accepted]:
            accepted += 1
        if best < 0 or accepted > best_accepted:
            best, best_accepted = index, accepted
    return best, best_accepted


def pass_tokens(inputs: list[int], levels: list[list[int]], candidates: list[Sequence[int]]) -> int:
    """Tokens one pass feeds: the input, the window and the candidate n-grams (its n in T(n))."""
    return len(inputs) + sum(len(level) for level in levels) + sum(len(c) for c in candidates)


def lookahead_step(sequence: KVSequence, inputs: list[int], levels: list[list[int]], candidates: list[Sequence[int]]
                   ) -> tuple[list[int], int, list[int]]:
    """One pass over input + window + candidates (`pass_tokens`). Returns the new tokens (accepted n-gram
    prefix plus the model's next token), how many n-gram tokens were accepted, and the newest level's
    predictions. On exit the cache holds what it held plus the input."""
    cached = sequence.length
    current = cached + len(inputs) - 1  # position of the current token
    window = [token for level in levels for token in level]
    positions = [*range(cached, cached + len(inputs)), *(current + offset for offset in window_positions(levels)),
                 *(current + 1 + i for candidate in candidates for i in range(len(candidate)))]
    visible = lookahead_mask(cached, len(inputs), levels, candidates)
    newest = len(inputs) + len(window) - len(levels[-1])  # query index of the newest level's first token
    keep = [len(inputs) - 1, *range(newest, len(inputs) + len(window)),
            *range(len(inputs) + len(window), len(positions))]
    tokens = [*inputs, *window, *(t for candidate in candidates for t in candidate)]
    predictions = greedy_tokens(sequence.forward(tokens, keep=keep, positions=positions, visible=visible)).tolist()
    sequence.crop(cached + len(inputs))  # window and candidates saw guesses: drop them

    first, newest_predictions = predictions[0], predictions[1:1 + len(levels[-1])]
    rest = predictions[1 + len(levels[-1]):]
    per_candidate, start = [], 0
    for candidate in candidates:
        per_candidate.append(rest[start:start + len(candidate)])
        start += len(candidate)
    index, accepted = best_candidate(first, per_candidate, candidates)
    if index < 0:
        return [first], 0, newest_predictions
    after = [first, *per_candidate[index]]
    return [*candidates[index][:accepted], after[accepted]], accepted, newest_predictions


CONFIG_KEYS = tuple(item.name for item in fields(LookaheadConfig))  # `generate`'s lookahead settings


def argument_problem(window, ngram_size, candidates, pool_from_prompt=False) -> str | None:
    """What is wrong with a lookahead configuration, or None."""
    for name, value, least in (("window", window, 1), ("ngram_size", ngram_size, 2), ("candidates", candidates, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return (f"{name} must be an integer >= {least}, got {value!r} "
                    f"(the paper's W, N, G; e.g. window=5, ngram_size=3, candidates=5)")
    if not isinstance(pool_from_prompt, bool):
        return f"pool_from_prompt must be true or false, got {pool_from_prompt!r}"
    return None


def config_problem(config) -> str | None:
    """What is wrong with a config mapping {window, ngram_size, candidates?, pool_from_prompt?}, or None."""
    if not isinstance(config, dict) or not {"window", "ngram_size"} <= set(config) or set(config) - set(CONFIG_KEYS):
        return (f"a lookahead config is a mapping with window and ngram_size, optionally candidates and "
                f"pool_from_prompt (keys {list(CONFIG_KEYS)}), e.g. {{window: 5, ngram_size: 3, candidates: 5}}; "
                f"got {config!r}")
    config = LookaheadConfig.from_mapping(config)
    return argument_problem(config.window, config.ngram_size, config.candidates, config.pool_from_prompt)


@torch.inference_mode()
def generate(
    model,
    prompt_ids,
    max_new_tokens: int,
    window: int = 5,
    ngram_size: int = 3,
    candidates: int | None = None,
    pool_from_prompt: bool = False,
    stop_ids: Iterable[int] | None = None,
    seed: int = 0,
) -> GenerationResult:
    """Greedy lookahead decoding, batch size 1: window W, n-gram size N, up to G candidate n-grams
    verified a step (None: G = W, as the paper's default). `pool_from_prompt` also fills the pool
    with the prompt's own n-grams (prompt lookup inside lookahead). `seed` only drives the window's
    initial guesses (random prompt tokens); the output does not depend on it.

    Counting: accepted_per_step = n-gram tokens kept, proposed_per_step = the longest candidate's
    length, target_forwards = passes (the first one also prefills)."""
    run = DecodingRun(model, prompt_ids, max_new_tokens, stop_ids)
    candidates = LookaheadConfig(window, ngram_size, candidates, pool_from_prompt).candidates  # None: G = W
    problem = argument_problem(window, ngram_size, candidates, pool_from_prompt)
    if problem:
        raise ValueError(problem)
    check_custom_mask_support(model)  # before the clock: once per model
    prompt_ids = run.prompt_ids
    rng = random.Random(seed)
    sequence = open_sequence(model)
    pool = NgramPool(per_key=max(candidates, 1))
    if pool_from_prompt:
        for start in range(len(prompt_ids) - ngram_size + 1):
            pool.add(prompt_ids[start:start + ngram_size])
    levels = [[rng.choice(prompt_ids) for _ in range(window)]]  # level 0; the window fills a level a step
    accepted_per_step, proposed_per_step, verified, provenance = [], [], 0, Provenance()
    fed = []  # tokens each pass feeds; the first pass also prefills the prompt

    with run:
        inputs, generated, stopped = list(prompt_ids), [], False
        while not stopped and len(generated) < max_new_tokens:
            left = max_new_tokens - len(generated)
            ngrams = [c[:left - 1] for c in pool.candidates(inputs[-1], candidates)] if left > 1 else []
            ngrams = [c for c in ngrams if c]
            fed.append(pass_tokens(inputs, levels, ngrams))
            new_tokens, accepted, newest = lookahead_step(sequence, inputs, levels, ngrams)
            # the model's own token is a correction where an n-gram agreeing with the accepted tokens
            # proposed another token for its position
            rejected = any(len(ngram) > accepted and list(ngram[:accepted]) == new_tokens[:accepted] for ngram in ngrams)
            provenance.add(len(accepted_per_step), [LOOKAHEAD_NGRAM] * accepted + [CORRECTION if rejected else TARGET])
            levels = advance_window(levels, newest, ngram_size, pool)
            new_tokens, stopped = cut_at_stop(new_tokens, run.stop_ids)
            if not generated:
                run.first_token_done()
            generated += new_tokens
            inputs = new_tokens
            accepted_per_step.append(accepted)
            proposed_per_step.append(max((len(c) for c in ngrams), default=0))
            verified += len(ngrams)

    return run.result(
        generated,
        accepted_per_step=accepted_per_step,
        proposed_per_step=proposed_per_step,
        target_forwards=len(accepted_per_step),
        forward_tokens=fed[1:],
        extras={"ngrams_verified": verified, "pool_size": len(pool),
                "window": window, "ngram_size": ngram_size, "candidates": candidates},
        **provenance.cut(len(generated)),
    )
