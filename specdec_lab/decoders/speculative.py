"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): draft, verify in one target
forward pass, keep the longest accepted prefix plus one token of the target's own.

Greedy: a draft token is accepted while it equals the target's argmax.
Sampling: accept draft token x with probability min(1, p(x)/q(x)); on the first rejection sample
from norm(max(0, p - q)); if all k are accepted, sample a bonus token from p. The output then
follows the target's distribution exactly, whatever the draft.

Candidates with parents form a token tree (`decoders.trees`): the same step verifies every branch in
one forward and keeps the accepted path. A chain goes through the plain causal forward.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

from specdec_lab.decoders.candidates import CandidateGenerator, Candidates
from specdec_lab.decoders.backend import Sequence, open_sequence, vocab_size
from specdec_lab.decoders.common import DecodingRun, Provenance, cut_at_stop
from specdec_lab.decoders.trees import is_chain, parents_of, step_origins, verify_tree
from specdec_lab.result import PROPOSAL, GenerationResult
from specdec_lab.sampling import GREEDY, Sampling, greedy_tokens, next_token, probabilities, sample


def accept_greedy(target_logits: torch.Tensor, candidates: list[int]) -> tuple[int, int]:
    """(number of candidates accepted, the target's next token after them)."""
    target_choice = greedy_tokens(target_logits).tolist()
    accepted = 0
    while accepted < len(candidates) and candidates[accepted] == target_choice[accepted]:
        accepted += 1
    return accepted, target_choice[accepted]


def _pad_vocab(probs: torch.Tensor, size: int) -> torch.Tensor:
    """Zero probability for ids a model's (padded or smaller) head does not cover."""
    return torch.nn.functional.pad(probs, (0, size - probs.shape[-1]))


def accept_sampled(
    target_logits: torch.Tensor, candidates: Candidates, sampling: Sampling, rng: torch.Generator | None
) -> tuple[int, int]:
    """Rejection sampling over the block; returns (accepted, next token)."""
    p = probabilities(target_logits, sampling)  # (n + 1, vocab_target)
    n = len(candidates.token_ids)
    ids = torch.tensor(candidates.token_ids, dtype=torch.long, device=p.device)
    if candidates.probs is None:  # deterministic proposal: q is one-hot on the proposed token
        q = torch.zeros(n, p.shape[-1], device=p.device).scatter_(1, ids[:, None], 1.0)
    else:
        q = candidates.probs.to(p.device)
    vocab = max(p.shape[-1], q.shape[-1])
    p, q = _pad_vocab(p, vocab), _pad_vocab(q, vocab)

    for i in range(n):
        x = ids[i]
        accept_probability = torch.clamp(p[i, x] / q[i, x], max=1.0)
        if torch.rand((), generator=rng, device=p.device) < accept_probability:
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        # p(x) < q(x) on rejection, so the residual has mass; the guard covers rounding only
        residual = residual / residual.sum() if residual.sum() > 0 else p[i]
        return i, int(sample(residual, rng))
    return n, int(sample(p[n], rng))


def verify(target: Sequence, tokens: list[int], candidates: Candidates, sampling: Sampling, rng
           ) -> tuple[list[int], int]:
    """Verify `candidates` after `tokens` in one target forward over what the cache does not hold
    yet (the whole prompt on the first step, then the last token) plus the candidates; roll the
    target cache back to the accepted prefix. Returns (the accepted candidates' indices, the target's
    next token). On exit the cache holds every token but the last."""
    if not is_chain(candidates):
        return verify_tree(target, tokens, candidates, sampling, rng)
    block = [*tokens[target.length:], *candidates.token_ids]
    logits = target.forward(block, keep=len(candidates.token_ids) + 1)
    if sampling.greedy:
        accepted, token = accept_greedy(logits, candidates.token_ids)
    else:
        accepted, token = accept_sampled(logits, candidates, sampling, rng)
    target.crop(len(tokens) + accepted)
    return list(range(accepted)), token


def speculative_step(
    target: Sequence, tokens: list[int], candidates: Candidates, sampling: Sampling, rng
) -> tuple[list[int], int]:
    """`verify`, returning (accepted candidate tokens, the target's next token)."""
    path, token = verify(target, tokens, candidates, sampling, rng)
    return [candidates.token_ids[node] for node in path], token


@torch.inference_mode()
def generate(
    target,
    candidate_generator: CandidateGenerator,
    prompt_ids,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    stop_ids: Iterable[int] | None = None,
) -> GenerationResult:
    """Speculative decoding of one prompt with any candidate generator (draft model, prompt lookup,
    chains or trees). The first step proposes from the prompt and verifies with the prefill, in one
    forward. A tree's `proposed_per_step` counts its nodes, `accepted_per_step` its accepted path."""
    run = DecodingRun(target, prompt_ids, max_new_tokens, stop_ids)
    rng = None if sampling.greedy else sampling.generator(run.device)
    target_sequence = open_sequence(target)
    candidate_generator.reset(vocab_size=vocab_size(target))  # no state from an earlier prompt
    accepted_per_step, proposed_per_step, provenance = [], [], Provenance()

    with run:
        tokens, generated, stopped = list(run.prompt_ids), [], False
        while not stopped and len(generated) < max_new_tokens:
            # at most (left - 1) candidates, so candidates + the target's own token still fit
            left = max_new_tokens - len(generated)
            candidates = candidate_generator.propose(tokens, left - 1, sampling, rng)
            path, token = verify(target_sequence, tokens, candidates, sampling, rng)
            accepted = len(path)
            new_tokens, stopped = cut_at_stop([*(candidates.token_ids[node] for node in path), token], run.stop_ids)
            provenance.add(len(accepted_per_step), step_origins(origins_of(candidates, candidate_generator),
                                                                parents_of(candidates), path))
            if not generated:
                run.first_token_done()  # the same event as transformers' assisted generation
            tokens += new_tokens
            generated += new_tokens
            candidate_generator.update(tokens, accepted, len(candidates.token_ids))
            accepted_per_step.append(accepted)
            proposed_per_step.append(len(candidates.token_ids))

    return run.result(
        generated,
        accepted_per_step=accepted_per_step,
        proposed_per_step=proposed_per_step,
        target_forwards=len(accepted_per_step),  # one forward a step; the first one is the prefill
        draft_forwards=candidate_generator.forwards,
        # a source that chooses per step (the hybrid) says what it chose
        extras={"sources": dict(Counter(candidate_generator.sources))} if hasattr(candidate_generator, "sources") else {},
        **provenance.cut(len(generated)),
    )


def origins_of(candidates: Candidates, candidate_generator) -> list[str]:
    """The source of every proposed token: the record's own labels (the hybrid's, per token), else the
    generator's one source."""
    if candidates.origins is not None:
        return candidates.origins
    return [getattr(candidate_generator, "origin", PROPOSAL)] * len(candidates.token_ids)
