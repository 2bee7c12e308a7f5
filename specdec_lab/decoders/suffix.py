"""Suffix decoding (SuffixDecoding, Oliaro et al. 2024; vLLM's `suffix` method): no model proposes. Two
suffix trees count every substring of up to `max_depth` tokens: one of the request's own text (its prompt
and what it has generated so far), one of the answers the method gave earlier in the same process. The
end of the sequence is matched in them, and what followed the match is proposed, most frequent first:

- a continuation token's probability is how often it followed, over how often its parent occurred;
  along a path the probabilities multiply, and nothing below `min_token_prob` is proposed;
- the match length limits the proposal: at most `spec_factor` * match length + `spec_offset` tokens
  (a one-token match predicts little), and at most k;
- every match length is tried, and the proposal with the highest score (the sum of its tokens'
  probabilities: the expected number accepted) wins;
- `tree=True` proposes the k most probable continuation nodes as a token tree (verified in one forward,
  `decoders.trees`); `tree=False`, the single most frequent path;
- given the target's measured cost curve, T(n) / T(1) (our rule, a cost-sized source; vLLM has none), the
  proposal is cut to the nodes worth verifying at that cost (`cost_model.nodes_worth_verifying`), on the
  nodes' probabilities; none at all where a plain step is worth more.

Two implementations sit behind the same candidate interface:
- `SuffixCandidates`, ours, in Python: as arctic-inference's rules, except that a tree proposal merges
  the request's and the earlier answers' proposals into one trie (the one of higher score whole, then the
  other's most probable nodes within k) where arctic-inference keeps the one of higher score only;
- `ArcticSuffixCandidates`, arctic-inference's C++ suffix tree (`make arctic` builds only that part of
  the package), the peer the issue names.

Unlike every other candidate source, these carry state from one prompt to the next (the earlier answers:
a `SuffixTrie` the method owns). A prompt run again (a repeat, the warm-up) first drops its own
earlier answer, so it never proposes what it is about to write. The history lives in the process: a run
resumed after a stop starts without the answers of the prompts finished before it.
"""

from __future__ import annotations

import heapq
import importlib.util
import itertools
from dataclasses import dataclass, field

from specdec_lab.cost_model import nodes_worth_verifying, verify_costs
from specdec_lab.decoders.candidates import Candidates
from specdec_lab.method import SuffixSettings
from specdec_lab.result import SUFFIX

ARCTIC_PACKAGE = "arctic-inference==0.3.0"  # the pin `make arctic` builds


# --- the suffix tree ------------------------------------------------------------------------------

class Node:
    __slots__ = ("children", "count")

    def __init__(self):
        self.children: dict[int, Node] = {}
        self.count = 0  # occurrences of the string from the root to here


def most_frequent_first(node: Node) -> list[tuple[int, Node]]:
    """A node's continuations, the most frequent first; among equals, the first seen (arctic-inference's
    linked lists break some of those ties otherwise: 5 proposals in 4,000 random ones differ)."""
    return sorted(node.children.items(), key=lambda item: -item[1].count)


@dataclass
class Speculation:
    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: under the sequence's last token
    probs: list[float] = field(default_factory=list)  # each node's estimated probability (its path's product)
    match_length: int = 0
    trust: float = 1.0  # the factor `probs` were scaled by (`scaled`)

    @property
    def score(self) -> float:
        """The expected number of accepted tokens."""
        return sum(self.probs)

    @property
    def counted_score(self) -> float:
        """The expected number of accepted tokens by the trees' counts alone, before the trust."""
        return self.score / self.trust


def scaled(speculation: Speculation, trust: float) -> Speculation:
    """The proposal with every node's probability times `trust` (the order of the nodes is kept)."""
    if not trust > 0:
        raise ValueError(f"a suffix proposal's trust must be > 0, got {trust!r}")
    return Speculation(speculation.token_ids, speculation.parents, [p * trust for p in speculation.probs],
                       speculation.match_length, speculation.trust * trust)


def sized(speculation: Speculation, relative_target) -> Speculation:
    """The proposal's first nodes worth verifying at the target's T(n) / T(1) (its nodes come most
    probable first, so the kept ones are a tree)."""
    n = nodes_worth_verifying(speculation.probs, relative_target)
    return Speculation(speculation.token_ids[:n], speculation.parents[:n], speculation.probs[:n],
                       speculation.match_length, speculation.trust)


class SuffixTrie:
    """Every substring of up to `max_depth` tokens of the sequences added, with how often it occurs
    (one node per distinct substring: an uncompressed suffix tree cut at `max_depth`). A sequence grows
    token by token: the suffixes ending at its last token are kept open, and each new token extends
    every one of them by a level."""

    def __init__(self, max_depth: int):
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"a suffix tree's max_depth must be an integer >= 1, got {max_depth!r} (e.g. 24)")
        self.max_depth = max_depth
        self.root = Node()
        self.sequences: dict[object, list[int]] = {}
        self.open: dict[object, list[Node]] = {}  # per sequence: the nodes of its suffixes shorter than max_depth

    def extend(self, sequence_id, tokens) -> None:
        text = self.sequences.setdefault(sequence_id, [])
        ends = self.open.get(sequence_id, [])
        for token in tokens:
            grown = []
            for node in (self.root, *ends):  # the root: the empty suffix, which the new token starts
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                child.count += 1
                grown.append(child)
            # grown: the suffixes ending here, shortest first; the one max_depth long can grow no more
            ends = grown if len(grown) < self.max_depth else grown[:-1]
            self.root.count += 1
            text.append(token)
        self.open[sequence_id] = ends

    def remove(self, sequence_id) -> None:
        """Take a sequence's substrings out again: every one loses an occurrence, and a node left with none
        goes, with what hangs below it (a longer string occurs at most as often as its prefix)."""
        text = self.sequences.pop(sequence_id, None)
        self.open.pop(sequence_id, None)
        if text is None:
            return
        for start in range(len(text)):
            node = self.root
            for token in text[start:start + self.max_depth]:
                parent, node = node, node.children[token]
                node.count -= 1
                if node.count == 0:
                    del parent.children[token]
                    break
        self.root.count -= len(text)

    def find(self, string) -> Node | None:
        node = self.root
        for token in string:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], max_tokens: int, spec_factor: float = 1.0, spec_offset: float = 0.0,
                  min_token_prob: float = 0.1, tree: bool = True) -> Speculation:
        """The best proposal over every match length (arctic-inference's `SuffixTree::speculate`)."""
        best = Speculation()
        for match_length in range(1, min(len(context), self.max_depth + 1)):
            node = self.find(context[-match_length:])
            if node is None:
                break  # a longer match contains this one: none exists either
            budget = max(0, min(max_tokens, int(match_length * spec_factor + spec_offset + 1e-6)))
            found = self._tree(node, budget, min_token_prob) if tree else self._path(node, budget, min_token_prob)
            if found.score >= best.score:  # ties: the longer match
                best = found
                best.match_length = match_length
        return best

    @staticmethod
    def _path(node: Node, budget: int, min_token_prob: float) -> Speculation:
        """The most frequent continuation, token by token, while its probability stays >= min_token_prob."""
        found, probability = Speculation(), 1.0
        while len(found.token_ids) < budget and node.children:
            token, child = max(node.children.items(), key=lambda item: item[1].count)  # ties: the first seen
            probability *= child.count / node.count
            if probability < min_token_prob:
                break
            found.parents.append(len(found.token_ids) - 1)
            found.token_ids.append(token)
            found.probs.append(probability)
            node = child
        return found

    @staticmethod
    def _tree(node: Node, budget: int, min_token_prob: float) -> Speculation:
        """The `budget` most probable continuation nodes, best first (a child is never more probable
        than its parent, so they form a tree); among equals, the one found first."""
        found, waiting, order = Speculation(), [], itertools.count()

        def wait_for_children(parent_node: Node, probability: float, index: int) -> None:
            for token, child in most_frequent_first(parent_node):
                p = probability * child.count / parent_node.count
                if p >= min_token_prob:
                    heapq.heappush(waiting, (-p, next(order), token, child, index))

        wait_for_children(node, 1.0, -1)
        while waiting and len(found.token_ids) < budget:
            negative_p, _, token, child, parent = heapq.heappop(waiting)
            found.token_ids.append(token)
            found.parents.append(parent)
            found.probs.append(-negative_p)
            wait_for_children(child, -negative_p, len(found.token_ids) - 1)
        return found


# --- the candidate sources ------------------------------------------------------------------------

def full_trust(match_length: int) -> float:
    """The trees' counts taken as probabilities, whatever the match."""
    return 1.0


class SuffixCandidates:
    """Our suffix decoding (see the module): k tokens (a tree's nodes, or a path's length) a step."""

    origin = SUFFIX

    def __init__(self, k: int = 16, tree: bool = True, settings: SuffixSettings = SuffixSettings(),
                 history: SuffixTrie | None = None, relative_target=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"suffix decoding's k (tokens proposed a step) must be an integer >= 1, got {k!r}")
        self.k, self.tree, self.settings = k, tree, settings
        # a factor on the trees' probabilities before a proposal is cut and weighed, given the proposal's match length:
        # 1 here; the hybrid sets it to the share, for that length of match, of what the trees expected that the
        # target accepted (a count over few occurrences is no probability, least of all after a one-token match)
        self.trust = full_trust
        # T(n) / T(1) for every n a proposal needs, where proposals are cut by the target's cost (None: uncut)
        self.verify_cost = verify_costs(relative_target, k + 1) if relative_target is not None else None
        # the answers this method gave earlier in the process, one per prompt
        self.history = history if history is not None else SuffixTrie(settings.max_depth)
        if self.history.max_depth != settings.max_depth:
            raise ValueError(f"the history's suffix tree is {self.history.max_depth} deep, the settings say "
                             f"{settings.max_depth}: build both from the same SuffixSettings")
        self.reset()

    def reset(self, vocab_size: int | None = None) -> None:
        self.forwards = 0
        self.request = None  # the prompt's tokens, once the first proposal has read them
        self.local = SuffixTrie(self.settings.max_depth)
        self.read = 0  # tokens of the sequence already in the trees
        self.proposed = Speculation()  # the last proposal's part of higher score (the hybrid weighs it, and keeps score)

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        if self.request is None:
            self.request = tuple(tokens)
            self.history.remove(self.request)  # this prompt's earlier answer: not a source for itself
            self.local.extend(0, tokens)
            self.read = len(tokens)
        budget = min(self.k, max_candidates)
        self.proposed = Speculation()
        if budget < 1:
            return Candidates([])
        context = list(tokens[-self.settings.max_depth:])
        rules = dict(max_tokens=budget, spec_factor=self.settings.spec_factor, spec_offset=self.settings.spec_offset,
                     min_token_prob=self.settings.min_token_prob, tree=self.tree)
        own, earlier = self.local.speculate(context, **rules), self.history.speculate(context, **rules)
        own, earlier = scaled(own, self.trust(own.match_length)), scaled(earlier, self.trust(earlier.match_length))
        if self.verify_cost is not None:
            own, earlier = sized(own, self.verify_cost), sized(earlier, self.verify_cost)
            budget = max(len(own.token_ids), len(earlier.token_ids))  # the merged tree: no larger than either's worth
        # the proposal of higher score is proposed whole; the other's nodes added to a tree are not counted
        self.proposed = own if own.score >= earlier.score else earlier
        if not self.tree:
            return Candidates(self.proposed.token_ids)
        return merged(own, earlier, budget)

    @property
    def expected(self) -> float:
        """The last proposal's expected accepted tokens: its trees' counts, times the trust."""
        return self.proposed.score

    def update(self, tokens, num_accepted, num_proposed) -> None:
        new = tokens[self.read:]
        self.local.extend(0, new)
        self.history.extend(self.request, new)
        self.read = len(tokens)


def merged(first: Speculation, second: Speculation, budget: int) -> Candidates:
    """One trie of the two proposals: the one of higher score whole (what arctic-inference proposes), then
    the other's most probable nodes while the budget lasts, paths both share counted once. A tree that
    holds arctic's proposal accepts at least what it accepts."""
    best, other = (first, second) if first.score >= second.score else (second, first)
    token_ids, parents, node_of = [], [], {}  # node_of[(parent node, token)]: the merged node

    def place(speculation: Speculation, index: int, mapped: dict) -> bool:
        """Map node `index` of `speculation` into the trie (a new node only if room is left)."""
        parent = speculation.parents[index]
        if parent >= 0 and parent not in mapped:
            return False  # its parent did not fit: neither does it
        key = (mapped[parent] if parent >= 0 else -1, speculation.token_ids[index])
        if key not in node_of:
            if len(token_ids) == budget:
                return False
            node_of[key] = len(token_ids)
            token_ids.append(key[1])
            parents.append(key[0])
        mapped[index] = node_of[key]
        return True

    mapped_best, mapped_other = {}, {}
    for index in range(len(best.token_ids)):
        place(best, index, mapped_best)
    # most probable first; a child is never more probable than its parent and comes after it, so a
    # parent is always placed (or refused) before its children
    for index in sorted(range(len(other.token_ids)), key=lambda node: (-other.probs[node], node)):
        place(other, index, mapped_other)
    return Candidates(token_ids, None, parents)


# --- arctic-inference's suffix tree (the peer) -----------------------------------------------------

def arctic_available() -> bool:
    return importlib.util.find_spec("arctic_inference") is not None


def arctic_cache(max_depth: int):
    """A fresh arctic-inference SuffixDecodingCache, or a clear error naming how to build it."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as error:
        raise ImportError(f"arctic-inference's suffix tree is not installed ({error}): run `make arctic`, which "
                          f"builds only its suffix-decoding part of {ARCTIC_PACKAGE} into .venv") from None
    return SuffixDecodingCache(max_tree_depth=max_depth)


class ArcticSuffixCandidates:
    """arctic-inference's suffix decoding behind our candidate interface: its cache (`SuffixDecodingCache`,
    the history of earlier answers inside it) is owned by the method, as our history trie is; its
    proposals are verified by our tree verifier, so the two differ in what they propose only."""

    origin = SUFFIX

    def __init__(self, cache, k: int = 16, tree: bool = True, settings: SuffixSettings = SuffixSettings(),
                 relative_target=None):
        if cache.max_tree_depth != settings.max_depth:
            raise ValueError(f"the arctic cache is {cache.max_tree_depth} deep, the settings say {settings.max_depth}")
        self.cache, self.k, self.tree, self.settings = cache, k, tree, settings
        # our sizing rule over its proposal, as ours (None: uncut)
        self.verify_cost = verify_costs(relative_target, k + 1) if relative_target is not None else None
        self.reset()

    def reset(self, vocab_size: int | None = None) -> None:
        self.forwards = 0
        self.request = None
        self.read = 0

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        if self.request is None:
            self.request = tuple(tokens)
            if self.request in self.cache.active_requests:  # an earlier run of this prompt, never stopped
                self.cache.stop_request(self.request)
            self.cache.start_request(self.request, list(tokens))  # drops this prompt's cached answer too
            self.read = len(tokens)
        budget = min(self.k, max_candidates)
        if budget < 1:
            return Candidates([])
        draft = self.cache.speculate(self.request, list(tokens[-self.settings.max_depth:]), max_spec_tokens=budget,
                                     max_spec_factor=self.settings.spec_factor,
                                     max_spec_offset=self.settings.spec_offset,
                                     min_token_prob=self.settings.min_token_prob, use_tree_spec=self.tree)
        found = Speculation(list(draft.token_ids), list(draft.parents), list(draft.probs))
        if self.verify_cost is not None:
            found = sized(found, self.verify_cost)
        return Candidates(found.token_ids, None, found.parents if self.tree else None)

    def update(self, tokens, num_accepted, num_proposed) -> None:
        new = list(tokens[self.read:])
        if new:
            self.cache.add_active_response(self.request, new)
        self.read = len(tokens)
