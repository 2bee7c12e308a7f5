"""Decoding a batch of prompts at once: a batched AR loop and batched speculative decoding whose rows
accept different numbers of tokens a step (ragged acceptance), greedy or sampled, lossless per row.

The batch's KV cache (`RaggedCache`) is one transformers cache of b rows. Rows grow at different
rates, so every cell of the cache is marked valid or not for its row: a row's share of the padding
that lines up inputs of different lengths, and its rejected proposals, stay in the cache as cells
that no query sees. Each forward gives every row its own positions (the count of its valid cells) and a
mask that shows each query its own row's valid cells and its own earlier inputs, nothing else, so a
row computes what it would alone. Columns that no row uses any more are dropped after every step, and
a row whose generation ended leaves the batch at once: no row waits on another's tokens, and the
forward shrinks with the batch.

    cache = RaggedCache(model, rows=3)
    logits = cache.forward([[5, 6, 7], [8], [9, 10]], keep=1)   # (3, 1, vocab): each row's next token
    cache.truncate(row=0, length=2)                              # row 0 keeps its first 2 tokens
    cache.select([0, 2])                                         # row 1 leaves the batch

Then the two decoders, in gpt-fast's shape: `generate_ar` (prefill the batch, one token per row a
forward) and `generate_speculative` (each row proposes, one forward verifies every row's proposal,
each row keeps its own accepted prefix). Candidate sources plug in behind `BatchedCandidateGenerator`:
`BatchedDraft` (one batched draft forward per drafted position) and `PerRow` (any model-free source,
prompt lookup, one instance per row, its proposals cut to the width the batch's measured cost pays for where
it is given one). Trees are not batched: a tree proposal is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache

from specdec_lab.cost_model import batch_width_worth_verifying
from specdec_lab.decoders.backend import additive_mask, engine, smallest_sliding_window, stop_token_ids, vocab_size
from specdec_lab.decoders.candidates import CandidateGenerator, Candidates
from specdec_lab.decoders.common import as_token_list, check_max_new_tokens, clock, cut_at_stop
from specdec_lab.decoders.speculative import accept_greedy, accept_sampled
from specdec_lab.decoders.trees import is_chain
from specdec_lab.memory import PeakMemory
from specdec_lab.result import CORRECTION, DRAFT_MODEL, TARGET, GenerationResult
from specdec_lab.sampling import GREEDY, Sampling, greedy_tokens, next_token, probabilities, sample

PAD_ID = 0  # the token id padding cells hold; no query ever sees them, so any id does


# --- the batch's cache ----------------------------------------------------------------------------------

class RaggedCache:
    """A transformers KV cache for `rows` sequences of different lengths (see the module's docstring).

    `valid[r, j]` says whether cell j of row r holds one of row r's tokens; row r's tokens are its
    valid cells in order, and `lengths[r]` counts them (the next token's position)."""

    def __init__(self, model, rows: int):
        if engine(model) != "transformers":
            raise ValueError(f"batched decoding runs on the transformers engine, but this model runs on {engine(model)}: "
                             "load it with models.load (llama.cpp's batches are not wired into the kit)")
        if rows < 1:
            raise ValueError(f"a batch needs at least one row, got {rows}")
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros(rows, 0, dtype=torch.bool)
        self.lengths = [0] * rows
        # a sliding-window layer (Gemma 2's) keeps its last `window` cells only, and the batch's own mask
        # replaces transformers' window mask: the batch refuses to grow past the smallest window
        self.window = smallest_sliding_window(self.cache)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def forward(self, inputs: Sequence[Sequence[int]], keep: int) -> torch.Tensor:
        """Append each row's `inputs[r]` (at least one token, any number) and return the logits of
        the last `keep` columns, shape (rows, keep, vocab). Inputs are lined up to the right (left
        padding), so row r's last m <= min(keep, len(inputs[r])) inputs are its last m columns; the
        columns before a row's first input are padding, and their logits mean nothing."""
        if len(inputs) != self.rows:
            raise ValueError(f"{len(inputs)} inputs for a batch of {self.rows} rows: give one list of tokens per row")
        sizes = [len(tokens) for tokens in inputs]
        width = max(sizes, default=0)
        if min(sizes, default=0) < 1 or not 1 <= keep <= width:
            raise ValueError(f"every row needs >= 1 input and keep in [1, longest input], got sizes {sizes}, keep {keep}")
        if self.window is not None and self.valid.shape[1] + width >= self.window:
            raise ValueError(f"the batch's cache would reach {self.valid.shape[1] + width} cells, past the model's sliding "
                             f"window of {self.window}: use shorter prompts or a lower max_new_tokens")
        real = torch.tensor([[column >= width - size for column in range(width)] for size in sizes])
        input_ids = torch.tensor([[PAD_ID] * (width - size) + list(tokens) for tokens, size in zip(inputs, sizes)])
        # a row's inputs stand at its next positions; a padding column gets any position (nobody sees it)
        positions = (torch.tensor(self.lengths)[:, None] + real.long().cumsum(1) - 1).clamp(min=0)
        # query i of row r sees the row's valid cells and its own real inputs up to i; a padding query
        # sees itself only, so its attention stays finite (a NaN key or value would poison the row)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        new = causal[None] & real[:, None, :]
        new |= torch.eye(width, dtype=torch.bool)[None] & ~real[:, :, None]
        visible = torch.cat([self.valid[:, None, :].expand(-1, width, -1), new], dim=2)
        device = self.model.device
        output = self.model(input_ids=input_ids.to(device), position_ids=positions.to(device),
                            attention_mask=additive_mask(visible, self.model.dtype, device),
                            cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.valid = torch.cat([self.valid, real], dim=1)
        self.lengths = [length + size for length, size in zip(self.lengths, sizes)]
        return output.logits

    def truncate(self, row: int, length: int) -> None:
        """Row `row` keeps its first `length` tokens (the batch's `crop`); its later cells stay as holes
        that nobody sees, until no row uses their columns."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"row {row} holds {self.lengths[row]} tokens, cannot keep {length}")
        cells = self.valid[row].nonzero().flatten()
        self.valid[row, cells[length:]] = False
        self.lengths[row] = length

    def select(self, rows: Sequence[int]) -> None:
        """Keep these rows of the batch (in this order): finished rows leave it."""
        index = torch.tensor(list(rows), dtype=torch.long)
        self.valid = self.valid[index]
        self.lengths = [self.lengths[row] for row in rows]
        self._take(lambda tensor: tensor[index.to(tensor.device)])

    def compact(self) -> None:
        """Drop the columns no row uses: trailing ones always (a view, no copy), holes in the middle
        (one row's rejected proposal beside another's accepted one, padding of rows gone) once they are a
        quarter of the cache, since gathering copies every layer's cache."""
        used = self.valid.any(0)
        unused = len(used) - int(used.sum())
        if not unused:
            return
        columns = used.nonzero().flatten()
        if len(columns) == 0 or int(columns[-1]) == len(columns) - 1:  # only trailing columns go
            self.valid = self.valid[:, : len(columns)]
            self._take(lambda tensor: tensor[..., : len(columns), :])
        elif unused >= len(used) / 4:
            self.valid = self.valid[:, columns]
            self._take(lambda tensor: tensor[..., columns.to(tensor.device), :])

    def _take(self, part: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every layer's keys and values by `part` of them (and a sliding-window layer's count of
        cells, which it reports as its length, by what is left)."""
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = part(layer.keys), part(layer.values)
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length = layer.keys.shape[-2]



# --- one request's bookkeeping --------------------------------------------------------------------------

@dataclass
class Request:
    """One row's prompt and everything its result record needs, filled a step at a time."""

    prompt: list[int]
    generated: list[int] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)
    proposed_per_step: list[int] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    finished_at: float | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    def add_step(self, accepted: list[int], token: int, proposed: int, origin: str, stop_ids,
                 max_new_tokens: int) -> bool:
        """Append a step's accepted proposals and the target's own token (cut at a stop token or at
        `max_new_tokens`); True when the request is finished."""
        step = len(self.accepted_per_step)
        new, stopped = cut_at_stop([*accepted, token], stop_ids)
        new = new[: max_new_tokens - len(self.generated)]
        own = CORRECTION if len(accepted) < proposed else TARGET
        labels = [origin] * len(accepted) + [own]
        self.generated += new
        self.origins += labels[: len(new)]
        self.steps += [step] * len(new)
        self.accepted_per_step.append(len(accepted))
        self.proposed_per_step.append(proposed)
        return stopped or len(self.generated) >= max_new_tokens


@dataclass
class BatchRun:
    """Set-up, clocks and result records around a batched decode loop (`common.DecodingRun` for b rows).
    Each request's wall time is its latency: from the batch's start to the step that finished it; its
    target forwards are the batch forwards it took part in; draft forwards are the batch's (one batched
    draft forward serves every row)."""

    model: object
    prompts: list[list[int]]
    max_new_tokens: int
    stop_ids: frozenset[int] | None = None

    def __post_init__(self):
        if not self.prompts:
            raise ValueError("an empty batch: give at least one prompt")
        self.requests = [Request(as_token_list(prompt)) for prompt in self.prompts]
        check_max_new_tokens(self.max_new_tokens)
        self.stop_ids = stop_token_ids(self.model) if self.stop_ids is None else frozenset(self.stop_ids)
        self.active = list(self.requests)  # the rows of the batch, in cache order
        self.forwards = 0
        self.device = self.model.device
        self.time_to_first_token_s = 0.0

    def __enter__(self) -> "BatchRun":
        self._memory = PeakMemory(self.device).__enter__()
        self._start = clock(self.device)
        return self

    def __exit__(self, *exc) -> None:
        self._memory.__exit__(*exc)

    def elapsed(self) -> float:
        return clock(self.device) - self._start

    def finish(self, done: Sequence[bool]) -> list[int]:
        """Mark the rows whose request ended, take them out of `active`; returns the rows that stay."""
        now = self.elapsed()
        if self.forwards == 1:  # the first forward yields every request's first token
            self.time_to_first_token_s = now
        for request, finished in zip(self.active, done):
            if finished:
                request.finished_at = now
        kept = [row for row, finished in enumerate(done) if not finished]
        self.active = [self.active[row] for row in kept]
        return kept

    def results(self, draft_forwards: int = 0) -> list[GenerationResult]:
        peak = self._memory.peak_bytes
        return [GenerationResult(
            prompt_length=len(request.prompt), tokens=request.generated, wall_time_s=request.finished_at,
            time_to_first_token_s=self.time_to_first_token_s, peak_memory_bytes=peak,
            accepted_per_step=request.accepted_per_step, proposed_per_step=request.proposed_per_step,
            target_forwards=len(request.accepted_per_step),  # the batch forwards this request took part in
            draft_forwards=draft_forwards, token_origins=request.origins, token_steps=request.steps,
            extras={"batch_size": len(self.requests), "batch_forwards": self.forwards,
                    "batch_wall_time_s": max(r.finished_at for r in self.requests)})
            for request in self.requests]


# --- batched AR --------------------------------------------------------------------------------------

@torch.inference_mode()
def generate_ar(model, prompts: Sequence, max_new_tokens: int, sampling: Sampling = GREEDY,
                stop_ids: Iterable[int] | None = None) -> list[GenerationResult]:
    """Greedy or sampled decoding of every prompt in one batch: prefill them together, then one token
    per row a forward; a finished row leaves the batch. One result per prompt, in order."""
    run = BatchRun(model, list(prompts), max_new_tokens, stop_ids)
    rng = None if sampling.greedy else sampling.generator(run.device)
    with run:
        cache = RaggedCache(model, len(run.requests))
        inputs = [request.prompt for request in run.requests]
        while run.active:
            logits = cache.forward(inputs, keep=1)[:, -1]
            run.forwards += 1
            tokens = [next_token(row_logits, sampling, rng) for row_logits in logits]
            done = [request.add_step([], token, 0, TARGET, run.stop_ids, max_new_tokens)
                    for request, token in zip(run.active, tokens)]
            kept = run.finish(done)
            if len(kept) < cache.rows:
                cache.select(kept)
                cache.compact()
            inputs = [[tokens[row]] for row in kept]
    return run.results()


# --- batched candidate sources ------------------------------------------------------------------------

class BatchedCandidateGenerator(Protocol):
    """`CandidateGenerator` for a batch: one proposal per row. `select` follows the batch when
    finished rows leave it."""

    forwards: int
    origin: str

    def reset(self, rows: int, vocab_size: int) -> None: ...

    def propose(self, tokens: list[list[int]], max_candidates: list[int], sampling: Sampling,
                rng: torch.Generator | None) -> list[Candidates]: ...

    def update(self, tokens: list[list[int]], num_accepted: list[int], num_proposed: list[int]) -> None: ...

    def select(self, rows: list[int]) -> None: ...


class BatchedDraft:
    """A draft model (the target's tokenizer) drafting k tokens for every row: one batched draft
    forward per drafted position, each row feeding first what its cache lacks (the prompt on the first
    step, then the 1-2 tokens the target added)."""

    origin = DRAFT_MODEL

    def __init__(self, model, k: int):
        if int(k) < 1:
            raise ValueError(f"draft length k must be >= 1, got {k}")
        self.model, self.k = model, int(k)
        self.reset(rows=1, vocab_size=None)

    def reset(self, rows: int, vocab_size: int | None) -> None:
        self.cache = RaggedCache(self.model, rows)
        self.vocab_size = vocab_size  # a padded draft head must not propose ids the target has no row for
        self.forwards = 0

    def propose(self, tokens, max_candidates, sampling, rng) -> list[Candidates]:
        k = min(self.k, max(max_candidates))
        if k < 1:
            return [Candidates([]) for _ in tokens]
        pending = [row_tokens[length:] for row_tokens, length in zip(tokens, self.cache.lengths)]
        proposed: list[list[int]] = [[] for _ in tokens]
        drawn_from: list[list[torch.Tensor]] = [[] for _ in tokens]
        for _ in range(k):
            logits = self.cache.forward(pending, keep=1)[:, -1, : self.vocab_size]
            self.forwards += 1
            choices = greedy_tokens(logits).tolist() if sampling.greedy else None  # all rows at once
            for row, row_logits in enumerate(logits):
                if sampling.greedy:  # greedy verification needs no q
                    proposed[row].append(choices[row])
                else:
                    q = probabilities(row_logits, sampling)
                    proposed[row].append(int(sample(q, rng)))
                    drawn_from[row].append(q)
            pending = [[row_proposed[-1]] for row_proposed in proposed]
        return [Candidates(row_proposed[:limit], torch.stack(row_q[:limit]) if row_q[:limit] else None)
                for row_proposed, row_q, limit in zip(proposed, drawn_from, max_candidates)]

    def update(self, tokens, num_accepted, num_proposed) -> None:
        # each row's cache is valid up to its last accepted token; the rest becomes holes
        for row, row_tokens in enumerate(tokens):
            self.cache.truncate(row, min(self.cache.lengths[row], len(row_tokens) - 1))
        self.cache.compact()

    def select(self, rows) -> None:
        self.cache.select(rows)
        self.cache.compact()


class PerRow:
    """Any model-free candidate generator (prompt lookup), one instance per row, built by `make`.

    Given the target's measured batch costs, `step_ms[b][n]` (ms of a forward over b rows of n tokens,
    `hardware.batch_cost_grid`), every row's proposal is cut to the width worth verifying at the batch's
    size (`cost_model.batch_width_worth_verifying`, on each row's `proposal_acceptance`): the batch's
    forward is as wide as its longest proposal, so a width pays only where the rows' tokens together
    pay for it, and none (a plain step) where they do not. The grid of the smallest measured batch
    size that holds the rows prices the step."""

    forwards = 0

    def __init__(self, make: Callable[[], CandidateGenerator], step_ms: Mapping[int, Mapping[int, float]] | None = None):
        self.make = make
        example = make()
        self.origin = example.origin
        self.sources: list[CandidateGenerator] = []
        if step_ms is not None and not hasattr(example, "proposal_acceptance"):
            raise ValueError(f"cutting a batch's proposals by cost needs each row's acceptance: "
                             f"{type(example).__name__} has no proposal_acceptance(); pass no step_ms")
        self.step_ms = {int(b): dict(costs) for b, costs in step_ms.items()} if step_ms is not None else None

    def reset(self, rows: int, vocab_size: int | None) -> None:
        self.sources = [self.make() for _ in range(rows)]
        for source in self.sources:
            source.reset(vocab_size)

    def propose(self, tokens, max_candidates, sampling, rng) -> list[Candidates]:
        proposals = [source.propose(row_tokens, limit, sampling, rng)
                     for source, row_tokens, limit in zip(self.sources, tokens, max_candidates)]
        if self.step_ms is None or not all(is_chain(candidates) for candidates in proposals):
            return proposals  # (a tree goes on whole, to be refused by the decoder)
        width = batch_width_worth_verifying(
            [source.proposal_acceptance(len(c.token_ids)) for source, c in zip(self.sources, proposals)],
            self.costs_at(len(self.sources)))
        return [candidates.prefix(width) for candidates in proposals]

    def costs_at(self, rows: int) -> dict[int, float]:
        """T_b(n) of the smallest measured batch size b >= rows (the largest measured, past them all)."""
        held = [b for b in sorted(self.step_ms) if b >= rows]
        return self.step_ms[held[0] if held else max(self.step_ms)]

    def update(self, tokens, num_accepted, num_proposed) -> None:
        for source, *step in zip(self.sources, tokens, num_accepted, num_proposed):
            source.update(*step)

    def select(self, rows) -> None:
        self.sources = [self.sources[row] for row in rows]


# --- batched speculative decoding -------------------------------------------------------------------

@torch.inference_mode()
def generate_speculative(target, candidate_generator: BatchedCandidateGenerator, prompts: Sequence,
                         max_new_tokens: int, sampling: Sampling = GREEDY,
                         stop_ids: Iterable[int] | None = None) -> list[GenerationResult]:
    """Speculative decoding of every prompt in one batch. A step: every row proposes (up to its tokens
    left - 1), one target forward verifies every row's proposal after what its cache lacks (the prompt
    on the first step), and each row keeps its own accepted prefix plus the target's next token, greedy
    or by rejection sampling (`speculative.accept_*`, row by row). A finished row leaves the batch."""
    run = BatchRun(target, list(prompts), max_new_tokens, stop_ids)
    rng = None if sampling.greedy else sampling.generator(run.device)
    with run:
        cache = RaggedCache(target, len(run.requests))
        candidate_generator.reset(len(run.requests), vocab_size(target))
        while run.active:
            texts = [request.tokens for request in run.active]  # prompt + generated, once a step
            left = [max_new_tokens - len(request.generated) for request in run.active]
            proposals = candidate_generator.propose(texts, [n - 1 for n in left], sampling, rng)
            for candidates in proposals:
                if not is_chain(candidates):
                    raise ValueError("batched speculative decoding verifies chains only: a token tree was proposed "
                                     "(use speculative.generate for trees, one sequence at a time)")
            inputs = [text[length:] + c.token_ids for text, length, c in zip(texts, cache.lengths, proposals)]
            keep = max(len(c.token_ids) for c in proposals) + 1
            logits = cache.forward(inputs, keep=keep)
            run.forwards += 1
            done, accepted_counts = [], []
            for row, (request, text, candidates) in enumerate(zip(run.active, texts, proposals)):
                proposed = len(candidates.token_ids)
                rows = logits[row, keep - proposed - 1:]  # this row's proposal and the position after it
                if sampling.greedy:
                    accepted, token = accept_greedy(rows, candidates.token_ids)
                else:
                    accepted, token = accept_sampled(rows, candidates, sampling, rng)
                cache.truncate(row, len(text) + accepted)  # every token but the new last one
                accepted_counts.append(accepted)
                done.append(request.add_step(candidates.token_ids[:accepted], token, proposed,
                                             candidate_generator.origin, run.stop_ids, max_new_tokens))
            candidate_generator.update([r.tokens for r in run.active], accepted_counts,
                                       [len(c.token_ids) for c in proposals])
            kept = run.finish(done)
            if len(kept) < cache.rows:
                cache.select(kept)
                candidate_generator.select(kept)
            cache.compact()
    return run.results(draft_forwards=candidate_generator.forwards)
