"""Token trees: several candidate continuations verified in one target forward (SpecInfer, Medusa,
EAGLE-2, Sequoia).

A tree is a `Candidates` record with parents: node i holds `token_ids[i]` and hangs under node
`parents[i]` (-1: under the sequence's last token, the root). Parents come before their children, and
siblings hold distinct tokens. A chain is the tree whose node i hangs under node i - 1.

One forward verifies the whole tree. Node i stands at position (last token's position + its depth) and
sees the cache, the new input tokens and its own ancestors, nothing else: a sibling or a cousin is
another guess at the same position, and seeing it would change the logits. Then:
- greedy: from the root, follow the child equal to the target's argmax; the first node without such a
  child ends the path, and the target's argmax there is the step's own token;
- sampling (SpecInfer's multi-step speculative sampling, with Sequoia's sampling without replacement):
  try a node's children in order; accept child x with min(1, p(x) / q(x)); on rejection the target's
  distribution becomes norm(max(p - q, 0)) and x leaves q (q is renormalised without it) for the next
  sibling; when every child is rejected, sample from what is left of p. The output follows the target's
  distribution exactly, whatever the tree.
Only the accepted path's cache entries are kept (`Sequence.retain`).
"""

from __future__ import annotations

import torch

from specdec_lab.result import CORRECTION, TARGET, side_branch
from specdec_lab.sampling import Sampling, greedy_tokens, probabilities, sample


# --- the tree's geometry -----------------------------------------------------------------------------

def chain_parents(length: int) -> list[int]:
    return list(range(-1, length - 1))


def parents_of(candidates) -> list[int]:
    """Every candidate's parent (-1: the root); a chain's when the record has none."""
    return chain_parents(len(candidates.token_ids)) if candidates.parents is None else list(candidates.parents)


def is_chain(candidates) -> bool:
    return candidates.parents is None or list(candidates.parents) == chain_parents(len(candidates.token_ids))


def tree_problem(token_ids, parents) -> str | None:
    """What makes `parents` no tree over `token_ids` (in the order verification needs), or None."""
    if len(parents) != len(token_ids):
        return f"{len(parents)} parents for {len(token_ids)} tokens: give one parent per token"
    seen_children = set()
    for node, parent in enumerate(parents):
        if not -1 <= parent < node:
            return f"node {node} has parent {parent}: a parent is -1 (the root) or an earlier node"
        if (parent, token_ids[node]) in seen_children:
            return f"node {node} repeats its sibling's token {token_ids[node]}: siblings must differ"
        seen_children.add((parent, token_ids[node]))
    return None


def depths(parents: list[int]) -> list[int]:
    """Depth of every node: 1 for a child of the root."""
    depth = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def children(parents: list[int]) -> list[list[int]]:
    """children(parents)[parent + 1]: the nodes under `parent` (-1: the root), in order."""
    below = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        below[parent + 1].append(node)
    return below


def ancestors(parents: list[int], node: int) -> list[int]:
    """The path from the root down to `node`, `node` included."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def level_order(shape: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A fixed tree's (parent, rank) nodes reordered level by level (stable within a level), parents
    renumbered: every level's nodes then follow the levels above, so cutting the tree at a depth keeps
    a prefix of the list."""
    node_depths = depths([parent for parent, _ in shape])
    order = sorted(range(len(shape)), key=lambda node: node_depths[node])
    number = {node: index for index, node in enumerate(order)}
    return [(number[shape[node][0]] if shape[node][0] >= 0 else -1, shape[node][1]) for node in order]


def tree_mask(cached: int, inputs: int, parents: list[int]) -> torch.Tensor:
    """Boolean (query, key) visibility of a forward over `inputs` new tokens then the tree's nodes,
    after `cached` tokens: every query sees the cache, the inputs see each other causally, a node sees
    every input and its ancestors and itself."""
    nodes = len(parents)
    visible = torch.zeros(inputs + nodes, cached + inputs + nodes, dtype=torch.bool)
    visible[:, :cached + inputs] = True
    visible[:inputs, cached:cached + inputs] = torch.ones(inputs, inputs, dtype=torch.bool).tril()
    for node in range(nodes):
        visible[inputs + node, [cached + inputs + a for a in ancestors(parents, node)]] = True
    return visible


# --- acceptance --------------------------------------------------------------------------------------

def accept_tree_greedy(logits: torch.Tensor, token_ids: list[int], parents: list[int]) -> tuple[list[int], int]:
    """(accepted path of node indices, the target's next token after it). Row 0 of `logits` follows the
    sequence's last token, row 1 + i follows node i."""
    choice = greedy_tokens(logits).tolist()
    below = children(parents)
    path, node = [], -1
    while True:
        wanted = choice[node + 1]
        node = next((child for child in below[node + 1] if token_ids[child] == wanted), None)
        if node is None:
            return path, wanted
        path.append(node)


def accept_tree_sampled(logits: torch.Tensor, candidates, sampling: Sampling, rng: torch.Generator | None
                        ) -> tuple[list[int], int]:
    """Multi-step speculative sampling over the tree (rows of `logits` as in accept_tree_greedy)."""
    token_ids, parents = candidates.token_ids, parents_of(candidates)
    p_rows = probabilities(logits, sampling)
    vocab = max(p_rows.shape[-1], candidates.probs.shape[-1] if candidates.probs is not None else 0,
                max(token_ids, default=0) + 1)
    p_rows = torch.nn.functional.pad(p_rows, (0, vocab - p_rows.shape[-1]))
    below = children(parents)
    path, node = [], -1
    while True:
        p, rejected = p_rows[node + 1], []
        for child in below[node + 1]:
            x = token_ids[child]
            q = draft_distribution(candidates, child, vocab, p.device)
            q[rejected] = 0.0  # sampled without replacement: a rejected sibling cannot be drawn again
            q = q / q.sum()
            if torch.rand((), generator=rng, device=p.device) < torch.clamp(p[x] / q[x], max=1.0):
                path.append(child)
                node = child
                break
            residual = torch.clamp(p - q, min=0.0)
            # p(x) < q(x) on rejection, so the residual has mass; the guard covers rounding only
            p = residual / residual.sum() if residual.sum() > 0 else p
            rejected.append(x)
        else:
            return path, int(sample(p, rng))


def draft_distribution(candidates, node: int, vocab: int, device) -> torch.Tensor:
    """The distribution node `node` was drawn from, `vocab` wide: its row of `probs`, or one-hot on its
    token for a deterministic proposal (prompt lookup)."""
    if candidates.probs is None:
        return torch.nn.functional.one_hot(torch.tensor(candidates.token_ids[node]), vocab).float().to(device)
    row = candidates.probs[node].float().to(device)
    return torch.nn.functional.pad(row, (0, vocab - row.shape[-1])).clone()


# --- one verification forward ------------------------------------------------------------------------

def verify_tree(sequence, tokens: list[int], candidates, sampling: Sampling, rng) -> tuple[list[int], int]:
    """Verify the tree after `tokens` in one forward over what the cache lacks (the inputs) plus every
    node; keep the inputs' and the accepted path's cache entries only. Returns (path, next token); on
    exit the cache holds every token but the last, as after a chain's step."""
    token_ids, parents = candidates.token_ids, parents_of(candidates)
    problem = tree_problem(token_ids, parents)
    if problem:
        raise ValueError(f"not a token tree: {problem}")
    cached = sequence.length
    inputs = tokens[cached:]
    positions = [*range(cached, cached + len(inputs)),
                 *(cached + len(inputs) - 1 + depth for depth in depths(parents))]
    rows = [len(inputs) - 1, *range(len(inputs), len(inputs) + len(token_ids))]
    logits = sequence.forward([*inputs, *token_ids], keep=rows, positions=positions,
                              visible=tree_mask(cached, len(inputs), parents))
    if sampling.greedy:
        path, token = accept_tree_greedy(logits, token_ids, parents)
    else:
        path, token = accept_tree_sampled(logits, candidates, sampling, rng)
    sequence.retain([*range(len(inputs)), *(len(inputs) + node for node in path)])
    return path, token


def step_origins(origins: list[str], parents: list[int], path: list[int]) -> list[str]:
    """Where each token of a verified step came from: every accepted node's source (marked as a side
    branch where the node was not its parent's first child), then the target's own token, a correction
    where a child of the path's last node was proposed and rejected."""
    below = children(parents)
    accepted = [origins[node] if below[parents[node] + 1][0] == node else side_branch(origins[node]) for node in path]
    last = path[-1] if path else -1
    return [*accepted, CORRECTION if below[last + 1] else TARGET]
