"""CLLM losses (Kou et al. 2024, section 3.2): consistency + AR.

Consistency: at a Jacobi state y (a block on its way to the fixed point y*), the model's next-token
distributions over the block should already be the ones it has at y*: KL(p(.|x, y*_<i) || p(.|x, y_<i)),
the target detached. Positions inside the state's converged prefix are masked: their context equals
the fixed point's, so they carry no signal (this is what the reference code masks). "global" compares
with the fixed point itself; "local" with the next state of the trajectory. The paper's target is the
fixed point's whole distribution ("soft"); "hard" uses cross-entropy on the fixed point's tokens
instead (its argmax there): only the argmax decides whether Jacobi keeps a token, and a small model's
flat distributions spread a soft target's signal over tokens that never matter.
AR: cross-entropy on the greedy output, which keeps the model's own text from drifting (the reference
code smooths its labels by 0.1; over a vocabulary of 152k that term, not the text, is most of the loss, so
smoothing is a setting here, off by default). Total = ar_weight * AR + consistency_weight * consistency;
the reference code uses 10 : 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specdec_lab.cllm.trajectories import Sample
from specdec_lab.decoders.backend import crop_cache
from specdec_lab.cllm.constants import CONSISTENCY_KINDS, CONSISTENCY_TARGETS
from specdec_lab.quality import common_prefix_length


@dataclass(frozen=True)
class LossWeights:
    ar_weight: float = 10.0
    consistency_weight: float = 1.0
    consistency: str = "global"  # or "local"
    label_smoothing: float = 0.0
    consistency_target: str = "soft"  # or "hard"

    def __post_init__(self):
        if self.consistency not in CONSISTENCY_KINDS:
            raise ValueError(f"consistency must be one of {CONSISTENCY_KINDS}, got {self.consistency!r}")
        if self.consistency_target not in CONSISTENCY_TARGETS:
            raise ValueError(f"consistency_target must be one of {CONSISTENCY_TARGETS}, got {self.consistency_target!r}")
        if self.ar_weight < 0 or self.consistency_weight < 0 or self.ar_weight + self.consistency_weight == 0:
            raise ValueError(f"loss weights must be >= 0 and not both 0, got ar_weight={self.ar_weight}, "
                             f"consistency_weight={self.consistency_weight}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


def consistency_mask(state: Sequence[int], fixed_point: Sequence[int]) -> torch.Tensor:
    """True at the block positions that count: those after the state's converged prefix."""
    mask = torch.ones(len(fixed_point), dtype=torch.bool)
    mask[: common_prefix_length(state, fixed_point)] = False
    return mask


def consistency_loss(student_logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over unmasked positions of KL(target || student); 0 when nothing is unmasked.

    KL rather than the reference's soft cross-entropy: same gradient, but 0 at agreement, so the
    logged number says how far the state's predictions are from the fixed point's."""
    mask = mask.to(student_logits.device)
    if not mask.any():
        return student_logits.sum() * 0.0  # keeps the graph (and DDP) intact
    student = F.log_softmax(student_logits[mask].float(), dim=-1)
    target = F.log_softmax(target_logits[mask].detach().float(), dim=-1)
    return F.kl_div(student, target, log_target=True, reduction="batchmean")


def hard_consistency_loss(student_logits: torch.Tensor, target_tokens: Sequence[int], mask: torch.Tensor) -> torch.Tensor:
    """Mean over unmasked positions of the cross-entropy on the fixed point's tokens; 0 when nothing is unmasked."""
    if not mask.any():
        return student_logits.sum() * 0.0
    kept = [token for token, keep in zip(target_tokens, mask.tolist()) if keep]
    return ar_loss(student_logits[mask.to(student_logits.device)], kept, label_smoothing=0.0)


def ar_loss(logits: torch.Tensor, labels: Sequence[int], label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of the rows of `logits` (one per label) against `labels`."""
    target = torch.tensor(list(labels), dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing)


def _logits(model, token_ids: Sequence[int] | Sequence[Sequence[int]], cache: DynamicCache,
            logits_to_keep: int = 0) -> torch.Tensor:
    """Logits (n, vocab) for one token list, (batch, n, vocab) for a list of equal-length lists;
    with `logits_to_keep` k > 0, only the last k rows."""
    batched = bool(token_ids) and isinstance(token_ids[0], (list, tuple))
    rows = [list(t) for t in token_ids] if batched else [list(token_ids)]
    input_ids = torch.tensor(rows, dtype=torch.long, device=unwrapped(model).device)
    logits = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=logits_to_keep).logits
    return logits if batched else logits[0]


def unwrapped(model):
    """The model itself under a DistributedDataParallel (or similar) wrapper, for its config and
    device; the forward passes still go through the wrapper, which synchronises the gradients."""
    return getattr(model, "module", model)


def prompt_logits(model, states: Sequence[Sample], consistency: str = "global") -> dict:
    """The logits the losses need for some states of one prompt's trajectories.

    One pass over prompt + greedy output gives the AR rows and the fixed points' distributions. The
    states of one block then run together, as a batch, on top of that pass's KV cache cut back to the
    block's start: the prefix is computed once per prompt, the weights are read once per block, and
    gradients still flow through the prefix. Blocks go latest first, since a cache can only be cut
    shorter. Each state's "state" and "target" rows predict its block's tokens 0..n-1; the "output"
    rows predict the greedy output's tokens. An answer-only sample (no state: `answer_records`)
    adds no state rows.
    """
    first = states[0]
    if any(s.prompt_ids != first.prompt_ids or s.output_ids != first.output_ids for s in states):
        raise ValueError("prompt_logits takes states of one prompt only (same prompt and greedy output)")
    sequence = first.prompt_ids + first.output_ids
    prompt_length = len(first.prompt_ids)
    cache = DynamicCache(config=unwrapped(model).config)
    # Only the rows from the prompt's last token on predict something trained on; the LM head of the
    # prompt's rows would be wasted work (a quarter of a 0.5B Qwen's forward: its vocabulary is 152k).
    # Row j of `logits` is sequence position prompt_length - 1 + j.
    logits = _logits(model, sequence, cache, logits_to_keep=len(first.output_ids) + 1)
    per_state = []
    block_states = [s for s in states if s.fixed_point]
    for start in sorted({s.start for s in block_states}, reverse=True):
        block = [s for s in block_states if s.start == start]
        context = prompt_length + start  # tokens before the block
        n = len(block[0].fixed_point)
        # row context-1+i predicts block token i: feed the token before the block, then the state minus its last
        feed = lambda tokens: [sequence[context - 1], *tokens[: n - 1]]
        crop_cache(cache, context - 1)
        cache.batch_repeat_interleave(len(block))
        state_logits = _logits(model, [feed(s.state) for s in block], cache)
        if consistency == "global":
            targets = logits[start: start + n].expand(len(block), -1, -1)  # sequence positions context-1 on
        else:
            crop_cache(cache, context - 1)  # after the states' pass, whose graph keeps the prefix
            with torch.no_grad():
                targets = _logits(model, [feed(s.next_state) for s in block], cache)
        cache.batch_select_indices(torch.tensor([0], device=unwrapped(model).device))  # back to the one shared prefix
        per_state += [(s, state_logits[i], targets[i].detach()) for i, s in enumerate(block)]
    return {"output": logits[:-1], "states": per_state}


def prompt_losses(model, states: Sequence[Sample], weights: LossWeights) -> dict[str, torch.Tensor]:
    """AR loss of one prompt's greedy output (or reference answer), consistency loss averaged over
    the given states of its trajectories (0 without states), and the weighted total."""
    logits = prompt_logits(model, states, weights.consistency)
    ar = ar_loss(logits["output"], states[0].output_ids, weights.label_smoothing)

    def one_state(sample: Sample, state_logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mask = consistency_mask(sample.state, sample.fixed_point)
        if weights.consistency_target == "hard":
            return hard_consistency_loss(state_logits, sample.fixed_point, mask)
        return consistency_loss(state_logits, target, mask)

    if logits["states"]:
        consistency = torch.stack([one_state(*state) for state in logits["states"]]).mean()
    else:  # answer-only samples: fine-tuning on reference answers
        consistency = logits["output"].sum() * 0.0
    total = weights.ar_weight * ar + weights.consistency_weight * consistency
    return {"loss": total, "ar_loss": ar, "consistency_loss": consistency}
