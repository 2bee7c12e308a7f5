"""Candidate generators: who proposes the tokens the target verifies.

One small interface (after transformers' candidate_generator.py): `reset(vocab_size)` before a
prompt (the target's output size),
`propose()` up to k tokens with the distributions they were drawn from, `update()` with how many
the target accepted. A draft model and prompt lookup plug in behind it, as chains or as token trees
(`DraftTreeCandidates`, `PromptLookupTreeCandidates`; verification in `decoders.trees`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from specdec_lab.decoders.backend import engine, open_sequence
from specdec_lab.decoders.trees import ancestors, depths, level_order, tree_problem
from specdec_lab.cost_model import (cost_at, expected_tokens_per_step, nodes_worth_verifying, predicted_speedup,
                                    verify_costs)
from specdec_lab.method import SCHEDULES, HybridSettings
from specdec_lab.result import DRAFT_MODEL, PROMPT_LOOKUP, SUFFIX
from specdec_lab.sampling import Sampling, greedy_tokens, probabilities, sample


@dataclass
class Candidates:
    token_ids: list[int]
    # (len(token_ids), vocab) distributions the tokens were sampled from; None means the proposal
    # is deterministic (q is one-hot on each proposed token), as for prompt lookup.
    probs: torch.Tensor | None = None
    # a token tree: the node each token hangs under (-1: the sequence's last token), parents first.
    # None: a chain, token i under token i - 1. In a tree, `probs` row i is the distribution node i
    # was drawn from (its parent's), before its earlier siblings were taken out of it.
    parents: list[int] | None = None
    # where each token came from (`result` origins), where one record mixes sources (the hybrid's
    # looked-up tokens continued by the draft); None: the generator's `origin`, for every token
    origins: list[str] | None = None

    def prefix(self, n: int) -> "Candidates":
        """The first n tokens, with their q, parents and origins (a tree's first n nodes, parents first, are a tree)."""
        return Candidates(self.token_ids[:n], None if self.probs is None else self.probs[:n],
                          None if self.parents is None else self.parents[:n],
                          None if self.origins is None else self.origins[:n])


class CandidateGenerator(Protocol):
    forwards: int  # model forward passes spent proposing since reset()
    origin: str  # what its accepted tokens are labelled in the token views (`result.DRAFT_MODEL`, ...)

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
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown draft-length schedule {schedule!r}: use one of {SCHEDULES}")
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

    origin = DRAFT_MODEL

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
        self.sequence = open_sequence(self.model)
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
            logits = self.sequence.forward(pending, keep=1)[-1, : self.vocab_size]
            self.forwards += 1
            self.cached_length += len(pending)
            if sampling.greedy:  # greedy verification needs no q: skip the vocabulary-sized work
                wide = logits.float()  # one fp32 copy for the argmax and the confidence
                token = int(greedy_tokens(wide))
                top_probability = float(wide.softmax(-1).max()) if self.confidence_threshold else 1.0
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
        self.sequence.crop(self.cached_length)
        self.length.update(num_accepted, num_proposed)


class PromptLookupCandidates:
    """No model: find an earlier occurrence of the sequence's last tokens and propose the tokens
    that followed it.

    match="latest" is the classic rule: the latest earlier occurrence of the last n-gram, n from
    `max_ngram` down to `min_ngram`, k tokens. match="longest" (the default) picks the occurrence
    whose backward match with the sequence's end is longest (ties: the earliest), because a long
    match predicts a long continuation, and adapts to how its proposals fare, separately for each
    kind of match (its length: 1, 2, 3, 4 or more tokens):
    - the proposal grows by 2 after a block accepted whole and shrinks by 1 otherwise (from k,
      at most 2k), so a match that keeps matching is extended;
    - a kind whose proposals keep being rejected (under `min_accepted_per_step` tokens accepted
      per proposing step, after `min_tries` steps) proposes nothing: a plain AR step is cheaper
      than verifying tokens that will be rejected;
    - given the target's measured cost curve, `relative_target` (T(n) / T(1)), each proposal is cut to
      the tokens worth verifying at that cost (`cost_model.nodes_worth_verifying`), on the probability
      that its first i tokens are accepted, as the kind's record so far gives it (`accepted_first`);
      none at all where a plain step is worth more. Where T(n) is flat (bf16 with AMX) this keeps the whole proposal; where it is
      steep (AVX2 only, llama.cpp: T(2) = 1.5 T(1)) only what a kind's record pays for.
    """

    MATCH_KINDS = 4  # match lengths 1, 2, 3 and "4 or more" are told apart
    origin = PROMPT_LOOKUP

    def __init__(self, k: int = 10, max_ngram: int = 3, min_ngram: int = 1, match: str = "longest",
                 min_accepted_per_step: float = 0.25, min_tries: int = 4, relative_target=None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if match not in ("latest", "longest"):
            raise ValueError(f"unknown prompt-lookup match rule {match!r}: use 'latest' or 'longest'")
        if relative_target is not None and match != "longest":
            raise ValueError("prompt lookup's cut by T(n) weighs each kind of match's acceptance, which only "
                             f"match='longest' keeps: use it, or pass no relative_target (got match={match!r})")
        self.k, self.max_ngram, self.min_ngram, self.match = int(k), max_ngram, min_ngram, match
        self.min_accepted_per_step, self.min_tries = min_accepted_per_step, min_tries
        # T(n) / T(1) for every n a proposal needs (up to 2k + 1), where proposals are cut by cost (None: uncut)
        self.verify_cost = verify_costs(relative_target, 2 * self.k + 1) if relative_target is not None else None
        self.reset()

    def reset(self, vocab_size: int | None = None) -> None:
        self.forwards = 0
        self.lengths = [DraftLength(self.k, "heuristic") for _ in range(self.MATCH_KINDS)]
        # per kind of match and position i: steps whose proposal held token i and whose text held the i - 1
        # before it (`tried`), and of those, steps whose text held it too (`kept`); every match tries position 0
        self.tried = [[0] * (2 * self.k) for _ in range(self.MATCH_KINDS)]
        self.kept = [[0] * (2 * self.k) for _ in range(self.MATCH_KINDS)]
        self.kind = None  # the kind of match the last proposal came from
        self.pending = None  # (kind, the whole proposal before any cut, the text's length then), judged by `update`
        self.ran_out = False  # the last proposal stopped at the sequence's end, short of its kind's length

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        self.kind, self.pending = None, None
        if self.match == "latest":
            return Candidates(match_continuation(tokens, min(self.k, max_candidates),
                                                        self.max_ngram, self.min_ngram))
        follow_start, length = longest_match(tokens, self.min_ngram)
        if follow_start is None:
            return Candidates([])
        kind = min(length, self.MATCH_KINDS) - 1
        if self.keeps_being_rejected(kind):
            return Candidates([])  # an AR step instead
        proposal = tokens[follow_start:follow_start + min(self.lengths[kind].k, 2 * self.k, max_candidates)]
        # shorter than the kind's proposal length: the match reached the sequence's end (a draft may continue it)
        self.ran_out = len(proposal) < self.lengths[kind].k
        self.pending = (kind, proposal, len(tokens))
        if self.verify_cost is not None:
            worth = self.worth_verifying(kind, len(proposal))
            self.ran_out = self.ran_out and worth == len(proposal)  # cut short by cost: nothing to continue
            proposal = proposal[:worth]
        if not proposal:
            return Candidates([])  # no token of this kind's proposals pays for its share of the forward
        self.kind = kind
        return Candidates(proposal)

    def steps(self, kind: int) -> int:
        """Proposing steps of a kind of match so far."""
        return self.tried[kind][0]

    def accepted(self, kind: int) -> int:
        """Tokens a kind of match's proposals had accepted so far."""
        return sum(self.kept[kind])

    def keeps_being_rejected(self, kind: int) -> bool:
        """Under `min_accepted_per_step` tokens accepted a step, after `min_tries` steps."""
        steps = self.steps(kind)
        return steps >= self.min_tries and self.accepted(kind) < self.min_accepted_per_step * steps

    def accepted_first(self, kind: int, k: int) -> list[float]:
        """P(the first i tokens of a proposal are accepted), i = 1..k, from a kind of match's record: the
        product over positions j <= i of the share of steps that accepted token j when they had proposed it
        after accepting the j - 1 before it. Position by position, not Leviathan's i.i.d. alpha^i: a match
        tends to hold or fail whole (code copied from the prompt), which alpha^i underrates. Each share
        starts from one imagined try accepted with probability L / (L + 1), L the match's length: before
        any evidence a match of 1 token is trusted at 1/2 a position, one of 4 or more at 4/5."""
        prior = (kind + 1) / (kind + 2)
        tried, kept = self.tried[kind], self.kept[kind]
        found, probability = [], 1.0
        for position in range(k):
            probability *= (kept[position] + prior) / (tried[position] + 1)
            found.append(probability)
        return found

    def proposal_acceptance(self, proposed: int) -> list[float]:
        """P(the first i tokens of the last proposal are accepted), i = 1..proposed, from its kind's record."""
        return self.accepted_first(self.kind, proposed) if self.kind is not None and proposed else []

    def worth_verifying(self, kind: int, k: int) -> int:
        """How many of a proposal's first k tokens are worth verifying at the target's cost (0: none)."""
        return nodes_worth_verifying(self.accepted_first(kind, k), self.verify_cost)

    def update(self, tokens, num_accepted, num_proposed) -> None:
        if self.pending is not None:
            self.record(*self.pending, tokens)
            self.pending = None
        if self.kind is not None and num_proposed:
            self.lengths[self.kind].update(num_accepted, num_proposed)

    def record(self, kind: int, proposal: list[int], start: int, tokens: list[int]) -> None:
        """Judge a proposal's tokens by the text the target wrote after it (`tokens[start:]`), position by
        position, up to the first one the text does not hold. Verified tokens are judged as verification
        did (the text holds exactly the accepted ones, then the target's own token, which a rejected token
        never is); the target's own token also judges the first token a cut by cost left out (under
        sampling it equals that token with the probability verifying it would have accepted it). So a
        cut proposal still learns how far its kind's matches reach, and can grow back."""
        for position, (proposed, written) in enumerate(zip(proposal, tokens[start:])):
            self.tried[kind][position] += 1
            if proposed != written:
                return
            self.kept[kind][position] += 1


def match_continuation(tokens: list[int], k: int, max_ngram: int, min_ngram: int, earliest: bool = False) -> list[int]:
    """The k tokens that followed the latest (or, `earliest=True`, the first: transformers' rule)
    earlier occurrence of the last n-gram, trying n from `max_ngram` down to `min_ngram`; [] when
    there is none."""
    if k < 1:
        return []
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        pattern = tokens[-n:]
        starts = range(len(tokens) - n) if earliest else range(len(tokens) - n - 1, -1, -1)
        for start in starts:
            if tokens[start:start + n] == pattern:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []


def longest_match(tokens: list[int], min_length: int = 1, max_length: int = 64) -> tuple[int | None, int]:
    """(where the continuation starts, match length) of the earlier position whose tokens, read
    backwards, match the sequence's end for longest (at most `max_length`); ties go to the
    earliest, i.e. to the prompt, where the text a model quotes or edits lives (on HumanEval
    prompts this proposes the prompt's own code where the latest tie proposes the closing fence).
    (None, 0) when no match reaches `min_length`."""
    last = len(tokens) - 1
    best_end, best_length = None, 0
    for end in range(last):  # the occurrence ends at `end`; earliest first
        length = 0
        while length <= end and length < max_length and tokens[end - length] == tokens[last - length]:
            length += 1
        if length > best_length:
            best_end, best_length = end, length
    if best_length < min_length:
        return None, 0
    return best_end + 1, best_length


class DraftTreeCandidates:
    """The draft model grows a token tree (EAGLE-2's dynamic tree, Li et al. 2024), one batched draft
    forward per level:

    - every node of the newest level gets its draft's `branching` most likely children (under
      sampling: `branching` children drawn without replacement from the draft's distribution);
    - the `beam` new nodes of highest cumulative draft probability (the product along their path)
      are fed to the draft together, with a tree mask, and grow the next level;
    - after `depth` levels, greedy decoding keeps the `nodes` nodes of highest cumulative probability
      (a parent's is at least its child's, so the kept nodes still form a tree). Under sampling every
      drawn node stays: dropping a node because of the token it drew would bias the verification.

    With a `shape` ((parent, rank) per node, parents first: Sequoia's tree from `cost_model.tree_shape`)
    the tree is that one instead: each node is its parent's rank-th most likely draft token (under
    sampling: as many children as the shape gives, drawn without replacement), and a level's nodes that
    have children are fed together. Its expected acceptance is then what the picker predicts. With a
    `confidence_threshold`, a fixed tree stops as the adaptive chain does: after a level whose main-path
    parent (rank 0 under rank 0 from the root: the chain a degenerate tree is) has its top draft
    probability below the threshold, nothing deeper is drafted (a tree the picker sized as a chain then
    drafts what the adaptive chain drafts, not its full depth every step).

    The draft's cache holds the sequence's real tokens between steps, as for a chain; the tree's nodes
    leave it after every proposal. On llama.cpp, where a masked forward's cells cannot stay for the next
    one, each level's forward also re-feeds the nodes above it.
    """

    origin = DRAFT_MODEL

    def __init__(self, model, depth: int = 5, branching: int = 3, beam: int = 4, nodes: int = 16,
                 shape: Sequence[tuple[int, int]] | None = None, confidence_threshold: float = 0.0):
        for name, value in (("depth", depth), ("branching", branching), ("beam", beam), ("nodes", nodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"a draft tree's {name} must be an integer >= 1, got {value!r} "
                                 "(e.g. depth=5, branching=3, beam=4, nodes=16)")
        if not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"a draft tree's confidence_threshold must be in [0, 1), got {confidence_threshold}")
        if confidence_threshold and shape is None:
            raise ValueError("a confidence stop applies to a fixed tree (give its shape); a dynamic tree keeps "
                             "its most probable nodes instead")
        if shape is not None:
            shape = [(int(parent), int(rank)) for parent, rank in shape]
            # siblings of distinct ranks, as siblings of distinct tokens
            problem = tree_problem([rank for _, rank in shape], [parent for parent, _ in shape])
            if problem or not shape or any(rank < 0 for _, rank in shape):
                raise ValueError(f"a draft tree's shape is (parent, rank >= 0) per node, parents first, siblings of "
                                 f"distinct ranks: {problem or shape!r}")
            shape = level_order(shape)  # cut at a depth, the tree is then a prefix of the list
            depth = max(depths([parent for parent, _ in shape]))
        self.model, self.depth, self.branching, self.beam, self.nodes = model, depth, branching, beam, nodes
        self.shape, self.confidence_threshold = shape, confidence_threshold
        self.reset(vocab_size=None)

    def reset(self, vocab_size: int | None) -> None:
        self.vocab_size = vocab_size  # the draft's logits are cut to the target's head, as for a chain
        self.sequence = open_sequence(self.model)
        self.cached_length = 0
        self.forwards = 0

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        depth = min(self.depth, max_candidates)
        if depth < 1:
            return Candidates([])
        root_logits = self.sequence.forward(tokens[self.cached_length:], keep=1)[-1, : self.vocab_size]
        self.forwards += 1
        self.cached_length = base = len(tokens)
        if self.shape is not None:
            return self._fill(root_logits, base, depth, sampling, rng)
        token_ids, parents, scores, rows = [], [], [], []
        frontier, in_cache = [(-1, root_logits)], []
        for level in range(depth):
            newest = []
            for parent, logits in frontier:
                q = logits.float().softmax(-1) if sampling.greedy else probabilities(logits, sampling)
                width = min(self.branching, int((q > 0).sum()))
                chosen = (q.topk(width).indices if sampling.greedy
                          else torch.multinomial(q, width, replacement=False, generator=rng))
                for token in chosen.tolist():
                    token_ids.append(token)
                    parents.append(parent)
                    scores.append((scores[parent] if parent >= 0 else 0.0) + float(q[token].clamp_min(1e-30).log()))
                    if not sampling.greedy:
                        rows.append(q)
                    newest.append(len(token_ids) - 1)
            if level == depth - 1:
                break
            grow = sorted(sorted(newest, key=lambda node: -scores[node])[:self.beam])
            frontier, in_cache = self._grow(grow, token_ids, parents, base, in_cache)
        self.sequence.crop(base)  # the nodes were guesses: the cache keeps the real tokens only
        if sampling.greedy:
            return self._best(token_ids, parents, scores)
        return Candidates(token_ids, torch.stack(rows), parents)

    def _fill(self, root_logits, base, depth, sampling, rng) -> Candidates:
        """The fixed shape's nodes down to `depth`, filled in level by level (shape order = node order)."""
        node_depths = depths([parent for parent, _ in self.shape])
        shape = self.shape[:sum(d <= depth for d in node_depths)]  # level order: the nodes down to `depth`
        parents = [parent for parent, _ in shape]
        token_ids, rows = [None] * len(shape), [None] * len(shape)
        logits_of, in_cache, has_children = {-1: root_logits}, [], set(parents)
        main = -1  # the main path's node above this level
        for level in range(1, depth + 1):
            for parent in sorted({parents[node] for node in range(len(shape)) if node_depths[node] == level}):
                if parent not in logits_of:
                    continue  # a node the filter left without a token: its subtree stays empty
                below = [node for node in range(len(shape)) if parents[node] == parent]
                logits = logits_of[parent]
                if sampling.greedy:  # the ranks the shape asks for, from the draft's logits
                    wanted = min(max(shape[node][1] for node in below) + 1, logits.shape[-1])
                    ranked = logits.topk(wanted).indices.tolist()
                    chosen, q = [ranked[min(shape[node][1], len(ranked) - 1)] for node in below], None
                else:
                    q = probabilities(logits, sampling)
                    chosen = torch.multinomial(q, min(len(below), int((q > 0).sum())), replacement=False,
                                               generator=rng).tolist()
                for node, token in zip(below, chosen):
                    token_ids[node], rows[node] = token, q
            if self.confidence_threshold and main in logits_of:
                logits = logits_of[main]
                top = float((logits.float().softmax(-1) if sampling.greedy else probabilities(logits, sampling)).max())
                if top < self.confidence_threshold:
                    break  # the draft is unsure on its main path: nothing deeper (the nodes below stay empty)
            main = next((node for node in range(len(shape)) if parents[node] == main and shape[node][1] == 0), None)
            grow = [node for node in range(len(shape))
                    if node_depths[node] == level and node in has_children and token_ids[node] is not None]
            if grow:
                frontier, in_cache = self._grow(grow, token_ids, parents, base, in_cache)
                logits_of.update(frontier)
        self.sequence.crop(base)
        kept = [node for node in range(len(shape)) if token_ids[node] is not None]  # a narrow top-k/top-p
        if len(kept) < len(shape):  # filter left fewer tokens than children: the rest (and their subtrees) go
            kept = [node for node in kept if all(token_ids[a] is not None for a in ancestors(parents, node))]
            number = {node: index for index, node in enumerate(kept)}
            return Candidates([token_ids[n] for n in kept], None if sampling.greedy else torch.stack([rows[n] for n in kept]),
                              [number[parents[n]] if parents[n] >= 0 else -1 for n in kept])
        return Candidates(token_ids, None if sampling.greedy else torch.stack(rows), parents)

    def _grow(self, grow, token_ids, parents, base, in_cache):
        """One draft forward over the nodes `grow` (and, where the cache cannot hold them, their
        ancestors): each sees the real tokens and its own ancestors. Returns the next frontier
        [(node, logits after it)] and the nodes now in the draft's cache, in cache order."""
        if engine(self.model) == "llama.cpp":  # a masked forward's cells cannot stay: start from the real tokens
            self.sequence.crop(base)
            in_cache = []
        feed = sorted({a for node in grow for a in ancestors(parents, node)} - set(in_cache))
        order = in_cache + feed  # cache entries after `base`, then this forward's queries
        column = {node: base + index for index, node in enumerate(order)}
        visible = torch.zeros(len(feed), base + len(order), dtype=torch.bool)
        visible[:, :base] = True
        for query, node in enumerate(feed):
            visible[query, [column[a] for a in ancestors(parents, node)]] = True
        node_depths = depths(parents)
        logits = self.sequence.forward([token_ids[node] for node in feed], keep=[feed.index(node) for node in grow],
                                       positions=[base - 1 + node_depths[node] for node in feed], visible=visible)
        self.forwards += 1
        return list(zip(grow, logits[:, : self.vocab_size])), order

    def _best(self, token_ids, parents, scores) -> Candidates:
        """The `nodes` nodes of highest cumulative probability, renumbered in their order."""
        kept = sorted(sorted(range(len(token_ids)), key=lambda node: (-scores[node], node))[:self.nodes])
        number = {node: index for index, node in enumerate(kept)}
        return Candidates([token_ids[node] for node in kept], None,
                          [number[parents[node]] if parents[node] >= 0 else -1 for node in kept])

    def update(self, tokens, num_accepted, num_proposed) -> None:
        self.cached_length = min(self.cached_length, len(tokens) - 1)
        self.sequence.crop(self.cached_length)


def longest_matches(tokens: list[int], min_length: int = 1, count: int = 4, depth: int = 10,
                    max_length: int = 64) -> list[tuple[int, int]]:
    """Up to `count` (where the continuation starts, match length) of earlier positions whose tokens,
    read backwards, match the sequence's end, the longest matches first (ties: the earliest, as
    `longest_match`), one per distinct continuation of `depth` tokens."""
    last = len(tokens) - 1
    found = []
    for end in range(last):
        length = 0
        while length <= end and length < max_length and tokens[end - length] == tokens[last - length]:
            length += 1
        if length >= min_length:
            found.append((end + 1, length))
    found.sort(key=lambda match: (-match[1], match[0]))
    chosen, continuations = [], set()
    for start, length in found:
        continuation = tuple(tokens[start:start + depth])
        if continuation and continuation not in continuations:
            chosen.append((start, length))
            continuations.add(continuation)
            if len(chosen) == count:
                break
    return chosen


class PromptLookupTreeCandidates(PromptLookupCandidates):
    """Prompt lookup with several earlier matches at once: the continuations of the `branches`
    longest matches (one per distinct continuation) merged into a trie of at most `nodes` tokens, so
    the target checks every one of them in the same forward. No model is needed. The length of each
    continuation adapts, and a kind of match whose proposals keep being rejected proposes nothing, as
    for the chain (`PromptLookupCandidates`, match="longest", whose proposal is the first branch)."""

    def __init__(self, k: int = 10, branches: int = 4, nodes: int = 32, min_ngram: int = 1,
                 min_accepted_per_step: float = 0.25, min_tries: int = 4):
        for name, value in (("branches", branches), ("nodes", nodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"a prompt-lookup tree's {name} must be an integer >= 1, got {value!r}")
        super().__init__(k, max_ngram=min_ngram, min_ngram=min_ngram, match="longest",
                         min_accepted_per_step=min_accepted_per_step, min_tries=min_tries)
        self.branches, self.nodes = branches, nodes

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        self.kind = None
        depth = min(2 * self.k, max_candidates)
        matches = longest_matches(tokens, self.min_ngram, self.branches, depth) if depth >= 1 else []
        if not matches:
            return Candidates([])
        kind = min(matches[0][1], self.MATCH_KINDS) - 1
        if self.keeps_being_rejected(kind):
            return Candidates([])
        self.kind = kind
        depth = min(self.lengths[kind].k, depth)
        token_ids, parents, node_of = [], [], {}
        for start, _ in matches:
            parent = -1
            for token in tokens[start:start + depth]:
                if (parent, token) not in node_of:
                    if len(token_ids) == self.nodes:
                        break
                    node_of[parent, token] = len(token_ids)
                    token_ids.append(token)
                    parents.append(parent)
                parent = node_of[parent, token]
        self.proposed_depth = max(depths(parents), default=0)
        return Candidates(token_ids, None, parents)

    def update(self, tokens, num_accepted, num_proposed) -> None:
        # judged on the tree's depth, along whichever branch was accepted: every position up to the first
        # rejection tried, the accepted ones kept; a continuation accepted to its end grows the next one
        if self.kind is None or not num_proposed:
            return
        for position in range(min(num_accepted + 1, self.proposed_depth)):
            self.tried[self.kind][position] += 1
            self.kept[self.kind][position] += position < num_accepted
        self.lengths[self.kind].update(num_accepted, self.proposed_depth)


def trusted_share(accepted: float, expected: float, prior_share: float, prior_tokens: float) -> float:
    """The share of the expected tokens accepted, from a prior of `prior_tokens` accepted at `prior_share`;
    at most 1."""
    return min(1.0, (accepted + prior_share * prior_tokens) / (expected + prior_tokens))


SUFFIX_MATCH_KINDS = (1, 2, 4)  # the kinds of suffix match a trust is kept for: 1 token, 2-3, 4 or more
# A request's first proposal, its opening, is a kind of its own: a chat prompt ends in the template's tail
# ("<|im_start|>assistant\n"), whose last token alone matches what followed any newline. In 02's runs 6-8 (AMX Xeon,
# seventeenth session), suffix decoding's opening proposal (4 nodes) was rejected whole in all 45 requests, ours and
# arctic-inference's alike, and the hybrid's in the 39 it made one, while the adaptive draft's opening was accepted
# whole in 4 of the 6 code and math requests of each run.
SUFFIX_OPENING = 0
# how many expected tokens the record's prior trust in openings (as expected) weighs: a request has one opening, so
# no evidence of its own to weigh a prior against; the earlier requests' openings decide within one or two
OPENING_PRIOR_TOKENS = 1.0
# The most the draft's catch-up (in target steps) may cost at a request's opening. The opening is the one step at which
# nothing of the answer is known; a model-free or plain step costs one target step and shows the answer's first token,
# after which the sources are weighed as at every step. In 02's run 12 (AMX Xeon, eighteenth session) the hybrid opened
# 2 of 3 code requests with the draft, whose read of the 129-168-token prompt (1.8-2.3 target steps) bought one step of
# 3-6 tokens; the suffix trees copied the rest from the next step on, so the read cost 20-32% of those requests. The
# chat, short-QA and math prompts (44-67 tokens, 0.6-0.9 steps) are still opened by the draft where it pays.
OPENING_CATCH_UP_LIMIT = 1.0


def suffix_match_kind(match_length: int) -> int:
    """The kind of a suffix proposal's match. Replayed on 02's answers (AMX Xeon, sixteenth session), the target
    accepted 0.2-0.7 of what the trees' counts expected after a one-token match, and up to twice that after a
    match of 4 or more on code: one trust for all let a rejected one-token match (the newline that ends the chat
    template, continued as it went on in an earlier answer's code block) cut the trust in the long matches that follow."""
    return max((kind for kind in SUFFIX_MATCH_KINDS if match_length >= kind), default=SUFFIX_MATCH_KINDS[0])


@dataclass
class SuffixTrackRecord:
    """What the target accepted of the suffix trees' proposals, against what the trees' counts expected of them
    (the sum of their nodes' probabilities), by kind of match (`suffix_match_kind`), over a method's requests so
    far. The method's calls share one, as they share the tree of earlier answers: each request starts from the
    trust the run has measured, so the first step of every request does not go to trees taken at face value
    again (on math and chat, the twelfth session's run gave each request's first step to a 16-node tree the
    target rejected)."""

    accepted: Counter = field(default_factory=Counter)  # by kind of match
    expected: Counter = field(default_factory=Counter)

    def add(self, kind: int, accepted: int, expected: float) -> None:
        self.accepted[kind] += accepted
        self.expected[kind] += expected

    def trust(self, kind: int, prior_tokens: float) -> float:
        """The share of the expected tokens accepted after a match of this kind, from `prior_tokens` accepted as
        expected; at most 1."""
        return trusted_share(self.accepted[kind], self.expected[kind], 1.0, prior_tokens)


class HybridCandidates:
    """Each step, the candidate source the text favours right now (no peer offers this):

    - **prompt lookup**, when the sequence's end matches earlier text and matches of that kind
      (length) have been accepted: its proposals cost no model forward;
    - **prompt lookup continued by the draft model**, when a lookup proposal runs out (the match
      reaches the sequence's end) and drafting pays: the draft's chain continues after the looked-up tokens
      (`extend_lookups=False` turns this off; a draft tree does not continue lookups);
    - **the draft model**, while Leviathan's expected speedup at the draft's acceptance so far
      (a prior of `prior_acceptance` over `prior_tokens` tokens, then counted) exceeds 1: its adaptive chain, or
      given `draft_tree` (the draft picker's Sequoia shape, which may be a chain) that tree, filled as
      `DraftTreeCandidates` fills it, with the same confidence stop;
    - **suffix decoding** in prompt lookup's place, where it is given one (`suffix`): its trees match the
      request's own text and the answers given earlier, and its proposal (a tree, never continued by the
      draft) is expected to give 1 + its nodes' estimated probabilities, scaled by the share of what the
      trees expected that the target accepted after a match of its kind (length: `suffix_match_kind`): this
      request's evidence over a prior that is the share measured over the method's earlier requests
      (`suffix_record`, shared by its calls as the earlier answers are); a request's first proposal (its opening,
      `SUFFIX_OPENING`) is trusted as far as the earlier requests' openings were accepted;
    - **nothing**, a plain AR step, when neither is expected to pay. Every `explore_every` steps
      without drafting, the draft is tried once, so a drift of the text is noticed.

    The draft does not open a request whose prompt costs it more than `OPENING_CATCH_UP_LIMIT` target steps to read:
    the first step goes to the model-free proposal (or is a plain one), and the draft is weighed from the second step
    on, when the answer's first token shows whether the text copies what came before.

    A lookup proposal from a kind of match that has been accepted on average `a` tokens per step
    (counting one optimistic step that accepted the match's length, 1-4 tokens) is expected to give 1 + a tokens for about one
    target step (verifying n tokens costs little more than one on this hardware); the draft is
    expected to give its speedup. The larger wins. Lossless like every candidate source: the target
    verifies whatever is proposed.

    The draft reads every token it has not seen before it proposes: the whole prompt the first time,
    and all that lookup or plain steps added since it last drafted. At `prefill_cost_ratio` target steps
    a token (the draft's prefill per token over the target's AR step, measured), that catch-up is
    charged against the tokens left: the draft's speedup is weighed net of it (`net_draft_speedup`), so
    it runs (or is explored) only where drafting saves more than the catch-up costs, and a model-free
    proposal worth more than the net speedup wins against it. On a long prompt with few tokens to
    generate the draft's prefill can cost more than drafting gives back.

    Given the target's measured cost curve, `relative_target` (T(n) / T(1)), verifying is no longer taken
    as free: the lookups are cut to the tokens worth verifying (`PromptLookupCandidates`), a lookup is
    worth its expected tokens over T(n + 1) / T(1), and the draft its expected tokens over T(k + 1) / T(1)
    + k c (Leviathan's formula with the measured verify cost), at the k up to its adaptive one that this
    rates highest, which is also how many tokens it then drafts on its own (`draft_length`; continuing a lookup
    it fills the room the lookup left). On steep T(n) (AVX2 only, llama.cpp) this is
    what keeps a short lookup from losing to its own verification.
    """

    def __init__(self, draft_model, k: int = 5, prompt_lookup_k: int = 10, cost_ratio: float = 0.3,
                 prior_acceptance: float = HybridSettings.prior_acceptance, prior_tokens: int = 10,
                 explore_every: int = 8, confidence_threshold: float = 0.4,
                 extend_lookups: bool = HybridSettings.extend_lookups, draft=None, prefill_cost_ratio: float = 0.0,
                 relative_target=None, suffix=None, suffix_record: SuffixTrackRecord | None = None,
                 suffix_prior_tokens: float = HybridSettings.suffix_prior_tokens,
                 draft_tree: Sequence[tuple[int, int]] | None = None):
        if not 0 < cost_ratio:
            raise ValueError(f"cost_ratio (draft step / target step) must be > 0, got {cost_ratio}")
        if not prefill_cost_ratio >= 0:
            raise ValueError(f"prefill_cost_ratio (draft prefill per token / target step) must be >= 0, "
                             f"got {prefill_cost_ratio}")
        if not 0 <= prior_acceptance < 1:
            raise ValueError(f"prior_acceptance must be in [0, 1), got {prior_acceptance}")
        # `draft_tree`: (parent, rank) per node, parents first; the draft's proposals are that tree (on chat and short QA
        # in 02 on the AMX Xeon the picker's tree of 7 nodes beat the adaptive chain by 5%, and the hybrid drafted chains)
        self.draft_tree = level_order(list(draft_tree)) if draft_tree else None
        tree_depths = depths([parent for parent, _ in self.draft_tree]) if self.draft_tree else []
        # the tree's nodes down to each depth, counted once (`draft_speedup` reads them for every depth each step)
        self.tree_nodes_down_to = [sum(d <= depth for d in tree_depths)
                                   for depth in range(max(tree_depths, default=0) + 1)]
        # `draft`: another draft candidate source with the same rules (the picker's replayed draft, chain or tree)
        if draft is None:
            draft = (DraftTreeCandidates(draft_model, shape=self.draft_tree, confidence_threshold=confidence_threshold)
                     if self.draft_tree else DraftModelCandidates(draft_model, k, "heuristic", confidence_threshold))
        self.draft = draft
        self.lookup = PromptLookupCandidates(prompt_lookup_k, relative_target=relative_target)
        # `suffix`: a suffix-decoding source (`decoders.suffix.SuffixCandidates`) that proposes in the lookup's place:
        # its trees match the request's own text, as the lookup does, and the answers given earlier in the process
        self.suffix = suffix
        # the suffix trees' record over the method's requests (None: this source's own, over its own requests)
        self.suffix_record = suffix_record if suffix_record is not None else SuffixTrackRecord()
        if not suffix_prior_tokens > 0:
            raise ValueError(f"suffix_prior_tokens (the weight of the suffix trees' prior trust) must be > 0, "
                             f"got {suffix_prior_tokens}")
        self.suffix_prior_tokens = suffix_prior_tokens
        # T(n) / T(1) up to the curve's last measured n, flat beyond (the draft's k grows past the lookup's
        # 2 prompt_lookup_k); None: verifying is taken as free
        self.verify_cost = (verify_costs(relative_target, int(max(dict(relative_target))))
                            if relative_target is not None else None)
        self.cost_ratio, self.prior_acceptance, self.prior_tokens = cost_ratio, prior_acceptance, prior_tokens
        self.explore_every, self.extend_lookups = explore_every, extend_lookups
        self.prefill_cost_ratio = prefill_cost_ratio
        self.reset(vocab_size=None)

    def reset(self, vocab_size: int | None) -> None:
        self.draft.reset(vocab_size)
        self.lookup.reset(vocab_size)
        if self.suffix is not None:
            self.suffix.reset(vocab_size)
        self.suffix_request = SuffixTrackRecord()  # over this request's suffix proposals verified so far
        # by kind of match, what the earlier requests measured
        self.suffix_prior_trust = {kind: self.suffix_record.trust(kind, self.suffix_prior_tokens)
                                   for kind in SUFFIX_MATCH_KINDS}
        self.draft_accepted, self.draft_proposed = 0, 0
        self.drafted_depth = 0  # the deepest path of the last draft proposal
        self.steps_without_draft = 0
        self.draft_seen = 0  # tokens the draft has read (its cache, or its replay's stand-in)
        self.opening = True  # the next proposal is the request's first
        self.source, self.looked_up = None, 0
        self.sources: list[str] = []  # the source of every step, for the tables

    @property
    def forwards(self) -> int:
        return self.draft.forwards

    def draft_acceptance(self) -> float:
        return ((self.draft_accepted + self.prior_acceptance * self.prior_tokens)
                / (self.draft_proposed + self.prior_tokens))

    def draft_speedup(self, k: int) -> float:
        """Leviathan's formula for a proposal k deep: a chain's k tokens, or the tree's nodes down to depth k (all
        verified, one draft forward a level; its expected tokens counted along the main path only, as a chain's)."""
        if self.verify_cost is None:  # verifying k + 1 tokens taken to cost one step
            return predicted_speedup(self.draft_acceptance(), k, self.cost_ratio)
        return (expected_tokens_per_step(self.draft_acceptance(), k)
                / (cost_at(self.verify_cost, self.nodes_down_to(k) + 1) + k * self.cost_ratio))

    def nodes_down_to(self, depth: int) -> int:
        """The tokens a draft proposal `depth` deep verifies: the tree's nodes down to that depth, or a chain's `depth`."""
        return self.tree_nodes_down_to[min(depth, len(self.tree_nodes_down_to) - 1)] if self.draft_tree else depth

    def longest_draft(self) -> int:
        """The deepest proposal the draft makes now: the tree's depth, or the chain's adaptive k."""
        return len(self.tree_nodes_down_to) - 1 if self.draft_tree else self.draft.length.k

    def draft_length(self, longest: int) -> int:
        """How many tokens the draft proposes, at most `longest` (its adaptive k, or what is left): given the
        target's cost curve, the length that Leviathan's formula with the measured verify cost rates highest
        (the shortest of equals), since on a curve with a step (T(5) = 2.5 T(1) where T(4) = 1.3 T(1), int4
        weight-only on the AVX-512 BF16 EPYC) the tokens past it cost more than they bring and priced at the
        adaptive k the draft would not pay at all; without a curve, `longest`."""
        if self.verify_cost is None or longest < 1:
            return longest
        return max(range(1, longest + 1), key=self.draft_speedup)

    def lookup_gain(self, proposed: int) -> float:
        """Expected tokens of the last lookup proposal (`proposed` tokens long) per target step. Without a
        cost curve, verifying is taken as nearly free: 1 + the tokens its kind of match accepted per step,
        counting one optimistic step that accepted as many tokens as the match is long. Without that step,
        one early rejection (the first token of an answer often matches the prompt's chat template) would
        rank a kind that then keeps matching below the draft for the rest of the text. With one: the
        proposal's expected tokens by its kind's record (`accepted_first`), over T(proposed + 1) / T(1)."""
        kind = self.lookup.kind
        if self.verify_cost is not None:
            return (1 + sum(self.lookup.accepted_first(kind, proposed))) / cost_at(self.verify_cost, proposed + 1)
        optimistic = kind + 1  # the match's length
        return 1.0 + (self.lookup.accepted(kind) + optimistic) / (self.lookup.steps(kind) + 1)

    def suffix_kind(self, match_length: int) -> int:
        """The kind of the suffix proposal being made: the request's opening (`SUFFIX_OPENING`), else its match's."""
        return SUFFIX_OPENING if self.opening else suffix_match_kind(match_length)

    def suffix_trust(self, match_length: int) -> float:
        """The share of the tokens the suffix trees expected after a match of this kind (their probabilities' sum over
        this request's proposals verified) that the target accepted, from a prior over `suffix_prior_tokens` at the
        share the earlier requests measured; at most 1. At the request's opening: the share the earlier requests'
        openings measured, from a prior of `OPENING_PRIOR_TOKENS` accepted as expected."""
        if self.opening:
            return self.suffix_record.trust(SUFFIX_OPENING, OPENING_PRIOR_TOKENS)
        kind = suffix_match_kind(match_length)
        return trusted_share(self.suffix_request.accepted[kind], self.suffix_request.expected[kind],
                             self.suffix_prior_trust[kind], self.suffix_prior_tokens)

    def suffix_gain(self, proposed: int) -> float:
        """Expected tokens of the last suffix proposal (`proposed` nodes) per target step: 1 + its nodes'
        probabilities (the trees' counts, times `suffix_trust`), over T(proposed + 1) / T(1) given a cost curve."""
        verify = cost_at(self.verify_cost, proposed + 1) if self.verify_cost is not None else 1.0
        return (1 + self.suffix.expected) / verify

    def model_free(self, tokens, max_candidates, sampling, rng) -> tuple[Candidates, float, str]:
        """The model-free proposal (prompt lookup's, or the suffix trees'), its expected tokens per target step,
        and the origin its tokens are labelled with."""
        if self.suffix is not None:
            self.suffix.trust = self.suffix_trust  # the proposal is cut and weighed at the acceptance seen so far
            found = self.suffix.propose(tokens, max_candidates, sampling, rng)
            return found, self.suffix_gain(len(found.token_ids)) if found.token_ids else 0.0, SUFFIX
        found = self.lookup.propose(tokens, max_candidates, sampling, rng)
        return found, self.lookup_gain(len(found.token_ids)) if found.token_ids else 0.0, PROMPT_LOOKUP

    def catch_up_cost(self, tokens) -> float:
        """Target steps the draft spends reading what it has not seen, beyond the 1-2 tokens of a step."""
        return self.prefill_cost_ratio * max(0, len(tokens) - self.draft_seen - 2)

    def net_draft_speedup(self, tokens, left: int, speedup: float) -> float:
        """The draft's speedup over the `left` tokens to come with its catch-up counted, as if it made them all (the
        most the catch-up can be spread over): left / (left / speedup + catch-up). Above 1 exactly where drafting
        saves more target steps, left * (1 - 1 / speedup), than the catch-up costs."""
        return left / (left / speedup + self.catch_up_cost(tokens))

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        self.source, self.looked_up = "nothing", 0
        self.opening = not self.sources
        if max_candidates < 1:
            return self._chosen(Candidates([]))
        found, gain, origin = self.model_free(tokens, max_candidates, sampling, rng)
        draft_k = self.draft_length(min(self.longest_draft(), max_candidates))
        # net of its catch-up: a model-free proposal worth more wins, though the draft would be faster once caught up
        # (on 02's code prompts its prefill of the prompt bought the 3 tokens of a code block's opening, and the
        # suffix trees copied the rest)
        draft_speedup = self.net_draft_speedup(tokens, max_candidates + 1, self.draft_speedup(draft_k))
        # exploring is cheap only while the draft has (nearly) caught up: no prefill is spent on a probe
        explore = self.steps_without_draft >= self.explore_every and self.catch_up_cost(tokens) <= self.cost_ratio
        # a long prompt's read is not spent before the answer shows whether a model-free source carries it
        deferred = self.opening and self.catch_up_cost(tokens) > OPENING_CATCH_UP_LIMIT
        pays = draft_speedup > 1.0 and not deferred
        if found.token_ids and gain >= max(draft_speedup if pays else 1.0, 1.0):
            looked_up = found.token_ids
            self.source, self.looked_up = origin, len(looked_up)
            room = max_candidates - len(looked_up)
            # only a lookup's chain is continued: a suffix proposal is a tree, and the draft continues one path
            if (origin == PROMPT_LOOKUP and self.extend_lookups and not self.draft_tree and room > 0
                    and self.lookup.ran_out and (pays or explore)):
                self.source = "prompt lookup + draft model"
                drafted = self.draft.propose(list(tokens) + looked_up, room, sampling, rng)
                self._seen(len(tokens) + len(looked_up), drafted)
                return self._chosen(self._joined(looked_up, drafted, sampling))
            return self._chosen(replace(found, origins=[origin] * len(looked_up)))
        if pays or explore:
            self.source = "draft model"
            drafted = self.draft.propose(tokens, draft_k, sampling, rng)
            self._seen(len(tokens), drafted)
            self.drafted_depth = max(depths(drafted.parents), default=0) if drafted.parents else len(drafted.token_ids)
            return self._chosen(replace(drafted, origins=[DRAFT_MODEL] * len(drafted.token_ids)))
        return self._chosen(Candidates([]))

    def _seen(self, length: int, drafted: Candidates) -> None:
        """The draft read `length` tokens, then (a chain) each of its proposals but the last, as its cache holds; a
        tree's nodes leave the draft's cache after each proposal."""
        self.draft_seen = length if self.draft_tree else length + max(len(drafted.token_ids) - 1, 0)

    def _chosen(self, candidates: Candidates) -> Candidates:
        self.sources.append(self.source)
        self.steps_without_draft = 0 if "draft" in self.source else self.steps_without_draft + 1
        return candidates

    @staticmethod
    def _joined(looked_up: list[int], drafted: Candidates, sampling: Sampling) -> Candidates:
        """Looked-up tokens then drafted ones; under sampling, q is one-hot on each looked-up token."""
        origins = [PROMPT_LOOKUP] * len(looked_up) + [DRAFT_MODEL] * len(drafted.token_ids)
        if sampling.greedy or drafted.probs is None:
            return Candidates(looked_up + drafted.token_ids, origins=origins)
        # a draft head narrower than the target's may not cover a looked-up id: pad q (zero mass) to it
        width = max(drafted.probs.shape[-1], max(looked_up) + 1)
        q = torch.nn.functional.pad(drafted.probs, (0, width - drafted.probs.shape[-1]))
        one_hot = torch.zeros(len(looked_up), width, device=q.device)
        one_hot[torch.arange(len(looked_up)), torch.tensor(looked_up)] = 1.0
        return Candidates(looked_up + drafted.token_ids, torch.cat([one_hot, q]), origins=origins)

    def update(self, tokens, num_accepted, num_proposed) -> None:
        self.draft.update(tokens, 0, 0)  # the draft's cache back to the accepted prefix, whoever proposed
        self.draft_seen = min(self.draft_seen, len(tokens) - 1)
        if self.suffix is not None:  # its trees read every token, whoever proposed it
            self.suffix.update(tokens, num_accepted, num_proposed)
        if self.source == SUFFIX:  # what the trees expected of this proposal, before it was scaled by the trust
            kind, expected = self.suffix_kind(self.suffix.proposed.match_length), self.suffix.proposed.counted_score
            for record in (self.suffix_request, self.suffix_record):
                record.add(kind, num_accepted, expected)
        if self.source in ("prompt lookup", "prompt lookup + draft model"):
            self.lookup.update(tokens, min(num_accepted, self.looked_up), self.looked_up)
        drafted = num_proposed - self.looked_up
        if "draft" in self.source and drafted > 0 and num_accepted >= self.looked_up:
            # the draft's tokens were judged only if every looked-up token before them was accepted; a tree's were judged
            # along its accepted path, and one more was rejected unless that path reached the tree's deepest node
            accepted = num_accepted - self.looked_up
            deepest = self.drafted_depth if self.draft_tree else drafted
            self.draft_accepted += accepted
            self.draft_proposed += accepted + (1 if accepted < deepest else 0)
            if not self.draft_tree:
                self.draft.length.update(accepted, drafted)
