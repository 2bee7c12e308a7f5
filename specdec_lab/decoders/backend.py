"""The one interface every decoder runs on: a sequence's KV cache on some engine.

    sequence = open_sequence(model)               # an empty cache on the model's engine
    logits = sequence.forward(ids, keep=1)        # append ids; logits of the last row
    logits = sequence.forward(ids, keep=[0, 4], positions=..., visible=mask)   # custom attention
    sequence.crop(length)                         # roll the cache back to its first `length` tokens
    sequence.retain(rows)                         # keep only these rows of the last forward (a tree's path)
    sequence.length                               # tokens in the cache

Two engines implement it: transformers (a model and its `DynamicCache`) and llama.cpp (a GGUF file
on llama.cpp's kernels, `models.llama_cpp`). A decoder written against it runs unchanged on either.
`keep` is an int (the last k rows; 0 = all) or a list of row indices. `visible` is a boolean
(queries, length + queries) matrix: query i may attend to key j where it is True. `retain(rows)`
keeps the cache from before the last forward plus that forward's `rows` (ascending), which must be a
causal run: each row at the next position, seeing exactly the rows before it (a token tree's inputs
and accepted path). The other rows' entries are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence as Ordered
from typing import Protocol

import torch
from transformers import DynamicCache

from specdec_lab.method import ENGINES
from specdec_lab.models.llama_cpp import LlamaCppModel, LlamaCppSequence


class Sequence(Protocol):
    length: int

    def forward(self, token_ids: Ordered[int], keep: int | Ordered[int] = 0, positions: Ordered[int] | None = None,
                visible: torch.Tensor | None = None) -> torch.Tensor: ...

    def crop(self, length: int) -> None: ...

    def retain(self, rows: Ordered[int]) -> None: ...


def engine(model) -> str:
    """Which of ENGINES runs `model`: 'llama.cpp' for a loaded GGUF, else 'transformers'."""
    return ENGINES[1] if isinstance(model, LlamaCppModel) else ENGINES[0]


def open_sequence(model) -> Sequence:
    return LlamaCppSequence(model) if isinstance(model, LlamaCppModel) else TransformersSequence(model)


def vocab_size(model) -> int:
    """Rows of the model's output head (a padded head may exceed the tokenizer's vocabulary)."""
    return model.vocab_size if isinstance(model, LlamaCppModel) else model.config.vocab_size


def stop_token_ids(model, tokenizer=None) -> frozenset[int]:
    """The ids that end a generation: a GGUF's end-of-sequence tokens, or transformers'
    generation_config.eos_token_id (int or list), else the tokenizer's."""
    if isinstance(model, LlamaCppModel):
        return model.eos_token_ids
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


class TransformersSequence:
    """A transformers causal LM and its DynamicCache."""

    def __init__(self, model):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self._forward_start: int | None = None  # the cache's length before the last forward
        # A sliding-window layer (Gemma 2's) drops the cells that leave its window, so a cache past it can no
        # longer be rolled back (a rejected proposal, a tree's other branches, a Jacobi block) and a tree's mask
        # no longer matches its keys: the sequence refuses to grow past the smallest window.
        self.window = smallest_sliding_window(self.cache)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def forward(self, token_ids, keep=0, positions=None, visible=None) -> torch.Tensor:
        if self.window is not None and self.length + len(token_ids) >= self.window:
            raise ValueError(f"the cache would reach {self.length + len(token_ids)} tokens, past the model's sliding "
                             f"window of {self.window}: use shorter prompts or a lower max_new_tokens")
        device = self.model.device
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        # logits_to_keep=k computes the LM head for the last k rows only: a prefill needs one row
        # of vocabulary size, not one per prompt token
        keep = keep if isinstance(keep, int) else torch.tensor(list(keep), device=device)
        extra = {}
        if positions is not None:
            extra["position_ids"] = torch.tensor([list(positions)], device=device)
        if visible is not None:
            extra["attention_mask"] = additive_mask(visible, self.model.dtype, device)
        self._forward_start = self.length
        output = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=keep, **extra)
        return output.logits[0]

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length)
        self._forward_start = None

    def retain(self, rows) -> None:
        start, rows = self._forward_start, [int(row) for row in rows]
        if start is None or any(b <= a for a, b in zip(rows, rows[1:])) or (rows and start + rows[-1] >= self.length):
            raise ValueError(f"retain() keeps ascending rows of the last forward, got {rows} after a forward "
                             f"from {start} to {self.length}")
        if rows != list(range(len(rows))):  # a prefix of the forward stays where it is: cropping keeps it
            kept = torch.tensor([start + row for row in rows], device=self.model.device)
            for layer in self.cache.layers:  # move the kept entries down into one run after `start`
                layer.keys[..., start:start + len(rows), :] = layer.keys[..., kept, :]
                layer.values[..., start:start + len(rows), :] = layer.values[..., kept, :]
        self.crop(start + len(rows))
        self._forward_start = None


def smallest_sliding_window(cache: DynamicCache) -> int | None:
    """The shortest window of the cache's sliding-window layers (Gemma 2's), in tokens; None without any."""
    return min((layer.sliding_window for layer in cache.layers if hasattr(layer, "sliding_window")), default=None)


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Roll a transformers cache back to its first `length` tokens."""
    surplus = cache.get_seq_length() - length
    if surplus > 0:
        cache.crop(-surplus)  # DynamicCache.crop takes a negative count


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """The float mask transformers' eager and sdpa attention both add to the scores: 0 where `visible`,
    the dtype's lowest value elsewhere (exp() of it is exactly 0). A (q, k) matrix gives (1, 1, q, k);
    a batch's (rows, q, k) gives (rows, 1, q, k)."""
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible.to(torch.bool), torch.finfo(dtype).min)
    return (mask[None, None] if mask.dim() == 2 else mask[:, None]).to(device)
