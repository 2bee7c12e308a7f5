"""The draft picker: predict the speedup of every (candidate source, k) per kind of text from cheap
measurements, before timing any of them, and recommend one.

In greedy mode a lossless method's output is the target's greedy text y, so what a candidate source
would propose at each step, and how much of it the target would accept, follows from y alone:

- prompt lookup needs no model: replay it over y (the same `PromptLookupCandidates` object);
- a draft model proposes autoregressively from the accepted prefix, which is always a prefix of y:
  while its proposals are right they are its argmax given y's prefix, so one teacher-forced pass
  of the draft over prompt + y gives every proposal that can be accepted (`TeacherForcedDraft`);
  after its first wrong token nothing more is accepted, and it keeps proposing until its
  confidence stop or k (this cost is assumed, not seen);
- the hybrid runs its own choices over those two.

In fp32 the replay takes the decoder's steps exactly (the tests assert it). In bf16 a pass over many
tokens and one token at a time can round differently, so a near-tie may go the other way.

Replaying the decode loop gives, per step, the tokens verified and the draft forwards spent. The
time follows from measured costs: the target's prefill and AR step (from its AR run of the same
prompts), T(n) / T(1) of the target (verifying n tokens), the draft's T(1) and its prefill. The
predicted speedup is AR's predicted time over the method's, per prompt, then a geometric mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from tqdm.auto import tqdm

from specdec_lab import cost_model, data, hardware, metrics
from specdec_lab.decoders import autoregressive
from specdec_lab.decoders.candidates import (Candidates, DraftLength, HybridCandidates, PromptLookupCandidates,
                                            PromptLookupTreeCandidates, SuffixTrackRecord, match_continuation)
from specdec_lab.decoders.trees import children, depths, level_order, parents_of
from specdec_lab.decoders.backend import open_sequence, vocab_size as output_rows
from specdec_lab.decoders.common import clock
from specdec_lab.experiments import lineups
from specdec_lab.decoders.suffix import SuffixCandidates, SuffixTrie
from specdec_lab.method import CandidateSource, HybridSettings, SuffixSettings, TreeSettings, source_columns
from specdec_lab.result import DRAFT_MODEL, PROMPT_LOOKUP
from specdec_lab.sampling import GREEDY


# --- a draft model, teacher-forced --------------------------------------------------------------------

@dataclass
class DraftForecast:
    """The draft's argmax and top probability after each prefix of prompt + y: entry i predicts the
    token at position `offset` + i + 1 of the sequence (`offset` = the prompt's last position)."""

    offset: int
    argmax: list[int]
    top_probability: list[float]
    prefill_s: float  # the draft's prefill of the prompt, timed
    following: list[int] = field(default_factory=list)  # y itself: following[i] is the token entry i predicts
    rank: list[int] = field(default_factory=list)  # rank[i]: following[i]'s rank in the draft's entry i (0: argmax)

    def at(self, position: int) -> tuple[int, float]:
        """(argmax, top probability) after the sequence's first `position` + 1 tokens."""
        index = min(position - self.offset, len(self.argmax) - 1)
        return self.argmax[index], self.top_probability[index]


@torch.inference_mode()
def forecast_draft(draft_model, prompt_ids: list[int], continuation: list[int],
                   vocab_size: int | None = None) -> DraftForecast:
    """The draft's prefill of the prompt (timed: the draft pays it once per generation), then one
    teacher-forced pass over y through its cache. Logits are cut to the target's `vocab_size`, as
    `DraftModelCandidates` cuts them."""
    sequence, device = open_sequence(draft_model), draft_model.device
    start = clock(device)
    first = sequence.forward(prompt_ids, keep=1)
    prefill_s = clock(device) - start
    logits = torch.cat([first, sequence.forward(continuation)])[:, :vocab_size].float()
    following = torch.tensor(continuation, dtype=torch.long)
    rank = (logits[:len(continuation)] > logits[torch.arange(len(continuation)), following][:, None]).sum(-1)
    return DraftForecast(len(prompt_ids) - 1, logits.argmax(-1).tolist(), logits.softmax(-1).amax(-1).tolist(),
                         prefill_s, list(continuation), rank.tolist())


class TeacherForcedDraft:
    """A draft model's proposals replayed from its `DraftForecast`, with the candidate-generator
    interface and the draft-length rules of `DraftModelCandidates`. Proposal i is the forecast at
    the position i tokens on, which is the draft's real proposal while every token before it is
    right; after the first wrong one nothing is accepted whatever is proposed, and only the
    confidence stop there is a guess (taken from the forecast at that position)."""

    origin = DRAFT_MODEL

    def __init__(self, forecast: DraftForecast, k: int = 5, schedule: str = "constant",
                 confidence_threshold: float = 0.0):
        self.forecast, self.confidence_threshold = forecast, confidence_threshold
        self.length = DraftLength(k, schedule)
        self.reset(vocab_size=None)

    def reset(self, vocab_size: int | None = None) -> None:
        self.forwards = 0
        self.length.reset()

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        proposed = []
        for position in range(len(tokens) - 1, len(tokens) - 1 + min(self.length.k, max_candidates)):
            self.forwards += 1
            token, top_probability = self.forecast.at(position)
            proposed.append(token)
            if top_probability < self.confidence_threshold:
                break
        return Candidates(proposed)

    def update(self, tokens, num_accepted, num_proposed) -> None:
        self.length.update(num_accepted, num_proposed)


class TeacherForcedTree:
    """A draft tree of fixed shape ((parent, rank) per node, `cost_model.tree_shape`) replayed from
    the forecast. Along the accepted path the draft sees y's prefix, so the node of rank r under an
    accepted node holds y's next token exactly when y's token is the draft's rank-r choice there:
    that is what the forecast's ranks say. Every other node holds a token the replay never accepts.
    `widths` records the tokens each draft forward takes (the root's forward, then one per level)."""

    origin = DRAFT_MODEL

    def __init__(self, forecast: DraftForecast, shape: Sequence[tuple[int, int]], confidence_threshold: float = 0.0):
        self.forecast, self.shape = forecast, level_order(list(shape))  # as `DraftTreeCandidates` orders it
        self.node_depths = depths([parent for parent, _ in self.shape])
        self.confidence_threshold = confidence_threshold
        self.reset()

    def reset(self, vocab_size: int | None = None) -> None:
        self.forwards, self.widths = 0, []

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        position = len(tokens) - 1  # the forecast entry after the sequence's last token
        kept = range(sum(depth <= self.stop_depth(position, max_candidates) for depth in self.node_depths))
        if not kept:  # level order: the nodes down to a depth are a prefix
            return Candidates([])
        on_path, token_ids = {-1}, []
        for node in kept:
            parent, rank = self.shape[node]
            entry = position - self.forecast.offset + self.node_depths[node] - 1
            hit = (parent in on_path and entry < len(self.forecast.rank) and self.forecast.rank[entry] == rank)
            if hit:
                on_path.add(node)
            token_ids.append(self.forecast.following[entry] if hit else -1 - node)  # -1 - node: never accepted
        widths = grown_widths(self.shape[:len(kept)])  # one draft forward for each level that has children
        self.widths += [1, *widths]
        self.forwards += 1 + len(widths)
        return Candidates(token_ids, None, [self.shape[node][0] for node in kept])

    def stop_depth(self, position: int, max_candidates: int) -> int:
        """The deepest level drafted: the confidence stop read off the main path's top probabilities, the
        forecast's along y (the draft's real ones while the path is right; after that a guess, as for the
        chain's replay)."""
        depth = min(max(self.node_depths), max_candidates)
        if self.confidence_threshold:
            for level in range(1, depth + 1):
                if self.forecast.at(position + level - 1)[1] < self.confidence_threshold:
                    return level
        return depth

    def update(self, tokens, num_accepted, num_proposed) -> None:
        pass


# --- transformers' prompt lookup, for the peer's prediction ---------------------------------------

class FirstMatchLookup:
    """transformers' prompt-lookup rule: the first earlier occurrence of the last n-gram, n from
    `max_ngram` down to 1, k tokens after it."""

    origin = PROMPT_LOOKUP

    def __init__(self, k: int = 10, max_ngram: int = 2):
        self.k, self.max_ngram, self.forwards = k, max_ngram, 0

    def reset(self, vocab_size: int | None = None) -> None:
        pass

    def propose(self, tokens, max_candidates, sampling, rng) -> Candidates:
        return Candidates(match_continuation(tokens, min(self.k, max_candidates), self.max_ngram, 1, earliest=True))

    def update(self, tokens, num_accepted, num_proposed) -> None:
        pass


# --- the replay --------------------------------------------------------------------------------------

@dataclass
class Replay:
    proposed: list[int]  # per step, as `GenerationResult.proposed_per_step`
    accepted: list[int]  # per step, as `GenerationResult.accepted_per_step`
    draft_forwards: int
    draft_widths: list[int] | None = None  # tokens in each draft forward, where a source says (a tree's levels)

    @property
    def verified(self) -> list[int]:
        """Tokens in each target forward after the first (the first one is the prefill's)."""
        return [n + 1 for n in self.proposed[1:]]

    @property
    def uses_draft(self) -> bool:
        return self.draft_forwards > 0


def replay(source, prompt_ids: list[int], continuation: list[int], max_new_tokens: int | None = None) -> Replay:
    """Run `source` through the speculative loop against the known greedy output (which stopped at
    a stop token or at `max_new_tokens`: the decoder caps proposals by the latter)."""
    source.reset(vocab_size=None)
    budget = len(continuation) if max_new_tokens is None else max_new_tokens
    tokens, done, proposed_per_step, accepted_per_step = list(prompt_ids), 0, [], []
    while done < len(continuation):
        left = budget - done
        candidates = source.propose(tokens, left - 1, GREEDY, None)
        # (a proposal may run past the stop token that ended the text: the text ends there)
        accepted = accepted_along(candidates, continuation[done:])
        new = continuation[done:done + accepted + 1]
        tokens += new
        done += len(new)
        source.update(tokens, accepted, len(candidates.token_ids))
        proposed_per_step.append(len(candidates.token_ids))
        accepted_per_step.append(accepted)
    return Replay(proposed_per_step, accepted_per_step, source.forwards, getattr(source, "widths", None))


def accepted_along(candidates: Candidates, text: list[int]) -> int:
    """How many candidates greedy verification accepts when the target's text is `text`: the
    longest prefix of a chain, the longest root path of a tree, that spells its start."""
    below = children(parents_of(candidates))
    accepted, node = 0, -1
    while accepted < len(text):
        node = next((child for child in below[node + 1] if candidates.token_ids[child] == text[accepted]), None)
        if node is None:
            break
        accepted += 1
    return accepted


# --- costs and the prediction ------------------------------------------------------------------------

@dataclass
class Costs:
    """What the prediction needs to know about this machine."""

    relative_target: pd.Series  # T(n) / T(1) of the target, indexed by n
    draft_cost_ratio: float  # c = draft T(1) / target T(1)
    relative_draft: pd.Series | None = None  # T(n) / T(1) of the draft (a tree level feeds several tokens)
    draft_prefill_ratio: float = 0.0  # the draft's prefill per token / target T(1) (the hybrid's catch-up)

    def draft_forward(self, n: int) -> float:
        """A draft forward over n tokens, in target AR steps: c T_draft(n) / T_draft(1)."""
        relative = 1.0 if self.relative_draft is None or n <= 1 else cost_model.cost_at(self.relative_draft, n)
        return self.draft_cost_ratio * relative

    def verify(self, n: int) -> float:
        """T(n) / T(1), linear between measured n (flat beyond the last: an underestimate there)."""
        return cost_model.cost_at(self.relative_target, n)


def predicted_time(run: Replay, prefill_s: float, step_s: float, draft_prefill_s: float, costs: Costs) -> float:
    """Seconds: the target's prefill (the first verification rides on it), a target forward over
    each later step's tokens (T(n) / T(1) AR steps of `step_s`), and the draft's forwards at c AR
    steps each, its first one being its prefill."""
    target = sum(costs.verify(n) for n in run.verified) * step_s
    if not run.uses_draft:
        return prefill_s + target
    widths = run.draft_widths or [1] * run.draft_forwards
    return prefill_s + target + draft_prefill_s + sum(costs.draft_forward(n) for n in widths[1:]) * step_s


@dataclass(frozen=True)
class Candidate:
    """One candidate source the picker predicts, described by the same record as the line-up's
    method that runs it; `make(forecast)` builds its replay for one prompt."""

    name: str  # what the picker's tables show
    source: CandidateSource
    make: Callable[[DraftForecast], object]


def hybrid_candidate(k: int, prompt_lookup_k: int, cost_ratio: float, settings: HybridSettings,
                     adaptive_threshold: float = 0.4, prefill_cost_ratio: float = 0.0,
                     relative_target=None, suffix_k: int = 0, suffix: SuffixSettings | None = None) -> Candidate:
    """The hybrid with `settings`, its draft replayed (`relative_target`: verifying priced by it, as the line-up's),
    a chain or (`settings.draft_tree`) that tree; given `suffix_k`, suffix decoding proposes in the lookup's place, its
    earlier answers and its trees' record those of the calibration prompts replayed before (as the line-up's keeps
    its own)."""
    tree = settings.draft_tree_shape()
    suffix_source_of_call = lineups.hybrid_suffix(suffix_k, suffix, relative_target)
    suffix_record = SuffixTrackRecord()  # carried over the calibration prompts, as the line-up's over its prompts

    def make(forecast):
        return HybridCandidates(None, k, prompt_lookup_k, cost_ratio=cost_ratio, confidence_threshold=adaptive_threshold,
                                draft=(TeacherForcedTree(forecast, tree, adaptive_threshold) if tree
                                       else TeacherForcedDraft(forecast, k, "heuristic", adaptive_threshold)),
                                prior_acceptance=settings.prior_acceptance, extend_lookups=settings.extend_lookups,
                                prefill_cost_ratio=prefill_cost_ratio, relative_target=relative_target,
                                suffix=suffix_source_of_call(), suffix_record=suffix_record,
                                suffix_prior_tokens=settings.suffix_prior_tokens, draft_tree=tree)
    cut = relative_target is not None
    model_free = f"suffix tree {suffix_k} nodes" if suffix_k else f"lookup k={prompt_lookup_k}"
    return Candidate(f"hybrid (k from {k}, {model_free}; {settings.label()}){lineups.CUT_LABEL if cut else ''}",
                     lineups.hybrid_source(k, prompt_lookup_k, settings, adaptive_threshold, cut, suffix_k, suffix),
                     make)


# The weights of the suffix trees' prior trust the picker weighs: the default, under which a rejected tree or two
# stops them (where T(n) is steep, trees taken at face value cost more than they give), and one under which a
# request's first rejected tree does not (in 02 on the AMX Xeon, each request's first tree, matched on the chat
# template's end, was rejected, and code answers went to the draft where the trees' later proposals were accepted)
SUFFIX_PRIOR_GRID = (HybridSettings.suffix_prior_tokens, 32.0)


def hybrid_settings_grid(draft_agreement: float, suffix: bool = False, draft_tree: str | None = None) -> list[HybridSettings]:
    """The hybrid defaults the picker weighs: whether lookups that run out are extended by the draft and, where
    the hybrid proposes suffix trees (`suffix`), the weight of their prior trust (`SUFFIX_PRIOR_GRID`). The draft's
    prior acceptance is not weighed: it is the draft's measured teacher-forced agreement. A fixed prior chosen by
    replay on 2 prompts a kind is chosen by noise (in 02 on the AMX Xeon, 0.6 won by 2% in one run of four, and its
    hybrid proposed 1-2 draft tokens a step on chat, where the draft's agreement, 0.90, made chains of 5 pay). Nor is
    chain against tree: given the tree the picker sized (`draft_tree`, its label), the hybrid drafts it, as the
    sizing already weighed it against chains at this machine's T(n)."""
    prior = round(min(draft_agreement, 0.99), 2)
    suffix_priors = SUFFIX_PRIOR_GRID if suffix else (HybridSettings.suffix_prior_tokens,)
    return [HybridSettings(prior, extend, suffix_prior, draft_tree) for extend in (True, False)
            for suffix_prior in suffix_priors]


def choose_hybrid(calibrations, costs: "Costs", k: int, prompt_lookup_k: int, cost_ratio: float,
                  draft_agreement: float, adaptive_threshold: float = 0.4,
                  cost_sized: bool = False, suffix_k: int = 0, suffix: SuffixSettings | None = None,
                  draft_tree: str | None = None) -> tuple[HybridSettings, pd.DataFrame]:
    """The hybrid's defaults: the settings with the highest predicted speedup, a geometric mean over
    categories of each category's geometric mean over prompts (every kind of text counts alike);
    `cost_sized`: the hybrid priced by the measured T(n), as the line-up's; `suffix_k`: suffix decoding
    proposing in the lookup's place, as the line-up's; `draft_tree`: the tree the hybrid's draft fills (its label)."""
    records = []
    grid_settings = hybrid_settings_grid(draft_agreement, suffix=suffix_k > 0, draft_tree=draft_tree)
    for settings in grid_settings:
        candidate = hybrid_candidate(k, prompt_lookup_k, cost_ratio, settings, adaptive_threshold,
                                     costs.draft_prefill_ratio, costs.relative_target if cost_sized else None,
                                     suffix_k, suffix)
        by_category = per_category(predict(calibrations, [candidate], costs))
        records.append({**asdict(settings), **dict(zip(by_category.category, by_category.predicted_speedup)),
                        "overall": metrics.geometric_mean(by_category.predicted_speedup)})
    grid = pd.DataFrame(records)
    return grid_settings[int(grid.overall.to_numpy().argmax())], grid


def rank_acceptance(calibrations: Sequence[Calibration], ranks: int = 4) -> list[float]:
    """P(the target's greedy token is the draft's (r+1)-th ranked token), r < `ranks`, teacher-forced
    and pooled over the calibration prompts: rank 0 is the draft agreement."""
    found = [rank for cal in calibrations for rank in cal.forecast.rank]
    return [sum(rank == r for rank in found) / len(found) if found else 0.0 for r in range(ranks)]


def grown_widths(shape: Sequence[tuple[int, int]]) -> list[int]:
    """Per level but the last: how many of its nodes have children (one draft forward feeds them)."""
    parents = [parent for parent, _ in shape]
    node_depths, grown = depths(parents), set(parents)
    return [sum(1 for node, d in enumerate(node_depths) if d == level and node in grown)
            for level in range(1, max(node_depths))]


def size_tree(calibrations: Sequence[Calibration], costs: Costs, max_nodes: int, max_depth: int
              ) -> tuple[list[tuple[int, int]], pd.DataFrame]:
    """Sequoia's sizing on this machine: for each node budget n <= `max_nodes` and depth <= `max_depth`,
    the tree with the most expected accepted tokens under the draft's per-rank acceptance
    (`cost_model.tree_shape`), priced at one target forward over n + 1 tokens (T(n) / T(1)) and one
    draft forward per level. Returns the shape predicted fastest (steady state, a chain among the
    candidates: n = depth) and the whole grid."""
    acceptance = rank_acceptance(calibrations)
    records, shapes = [], {}
    for nodes in range(1, max_nodes + 1):
        for depth in range(1, min(nodes, max_depth) + 1):
            shape = cost_model.tree_shape(acceptance, nodes, depth)
            step_cost = (costs.verify(len(shape) + 1) + costs.draft_forward(1)
                         + sum(costs.draft_forward(width) for width in grown_widths(shape)))
            expected = cost_model.shape_value(acceptance, shape)
            shapes[nodes, depth] = shape
            records.append({"nodes": nodes, "depth": depth, "expected_accepted": expected,
                            "step_cost": step_cost, "predicted_speedup": (1 + expected) / step_cost,
                            "chain": len(shape) == max(depths([p for p, _ in shape]))})
    grid = pd.DataFrame(records)
    best = grid.loc[grid.predicted_speedup.idxmax()]
    return shapes[int(best.nodes), int(best.depth)], grid


def tree_candidates(tree_shape: Sequence[tuple[int, int]] | None, prompt_lookup_k: int,
                    lookup_tree: TreeSettings | None, adaptive_threshold: float = 0.4, suffix_k: int = 0,
                    suffix: SuffixSettings = SuffixSettings(), relative_target=None) -> list[Candidate]:
    """The token-tree sources the line-up runs: the picker's sized draft tree with the adaptive chain's
    confidence stop, replayed exactly (`TeacherForcedTree`), the prompt-lookup tree and our suffix-decoding
    tree, replayed as they run (no model: the replay is their run; the suffix tree keeps the calibration
    prompts' answers in order, as the line-up's keeps its prompts'; given `relative_target`, the target's
    T(n) / T(1), its proposals are cut by it, as the line-up's)."""
    listed = []
    if suffix_k:
        history = SuffixTrie(suffix.max_depth)
        cut = relative_target is not None
        listed.append(Candidate(f"suffix tree ({suffix_k} nodes){lineups.CUT_LABEL if cut else ''}",
                                lineups.suffix_source(suffix_k, True, suffix, cost_sized=cut),
                                lambda f: SuffixCandidates(suffix_k, True, suffix, history, relative_target)))
    if tree_shape:
        listed.append(Candidate(f"draft tree ({len(tree_shape)} nodes)",
                                lineups.sized_tree_source(tree_shape, adaptive_threshold),
                                lambda f: TeacherForcedTree(f, tree_shape, adaptive_threshold)))
    if lookup_tree is not None:
        listed.append(Candidate(f"prompt lookup tree ({lookup_tree.nodes} nodes)",
                                lineups.prompt_lookup_tree_source(prompt_lookup_k, lookup_tree),
                                lambda f: PromptLookupTreeCandidates(prompt_lookup_k, lookup_tree.branching,
                                                                     lookup_tree.nodes)))
    return listed


def candidates(k_values: Sequence[int], k: int, prompt_lookup_k: int, cost_ratio: float,
               hybrid_settings: HybridSettings, adaptive_threshold: float = 0.4,
               prefill_cost_ratio: float = 0.0, relative_target=None, suffix_k: int = 0,
               suffix: SuffixSettings | None = None) -> list[Candidate]:
    """Every source the picker weighs: the draft at each constant k and with the adaptive schedule,
    our prompt lookup, transformers' prompt lookup rule, and the hybrid with its chosen settings (given
    `relative_target`, the target's T(n) / T(1), our lookup and the hybrid cut and priced by it, as the
    line-up's; given `suffix_k`, the hybrid's suffix decoding in the lookup's place, as the line-up's)."""
    cut = relative_target is not None
    listed = [Candidate(f"draft k={kk}", lineups.draft_source(kk), lambda f, kk=kk: TeacherForcedDraft(f, kk))
              for kk in k_values]
    listed.append(Candidate(f"draft adaptive k from {k}", lineups.draft_source(k, "heuristic", adaptive_threshold),
                            lambda f: TeacherForcedDraft(f, k, "heuristic", adaptive_threshold)))
    listed.append(Candidate(f"prompt lookup k={prompt_lookup_k}{lineups.CUT_LABEL if cut else ''}",
                            lineups.prompt_lookup_source(prompt_lookup_k, cost_sized=cut),
                            lambda f: PromptLookupCandidates(prompt_lookup_k, max_ngram=lineups.PROMPT_LOOKUP_NGRAM,
                                                             relative_target=relative_target)))
    listed.append(Candidate(f"prompt lookup k={prompt_lookup_k} (transformers' rule)",
                            lineups.prompt_lookup_source(prompt_lookup_k, implementation="transformers"),
                            lambda f: FirstMatchLookup(prompt_lookup_k, lineups.TRANSFORMERS_PROMPT_LOOKUP_NGRAM)))
    listed.append(hybrid_candidate(k, prompt_lookup_k, cost_ratio, hybrid_settings, adaptive_threshold,
                                   prefill_cost_ratio, relative_target, suffix_k, suffix))
    return listed


@dataclass
class Calibration:
    """One prompt's cheap measurements: the target's greedy output and times (its AR run), the draft's forecast."""

    prompt_id: str
    category: str
    prompt_ids: list[int]
    continuation: list[int]
    max_new_tokens: int
    prefill_s: float  # target AR's time to first token
    step_s: float  # target AR's time per later token
    forecast: DraftForecast


def calibration(prompt: data.Prompt, prompt_ids: list[int], tokens: list[int], first_token_s: float, wall_s: float,
                max_new_tokens: int, draft, vocab_size: int) -> Calibration:
    """One prompt's calibration from its AR run (greedy tokens, time to first token, wall time)
    and a draft forecast along those tokens."""
    step_s = (wall_s - first_token_s) / max(len(tokens) - 1, 1)
    return Calibration(prompt.id, prompt.category, prompt_ids, tokens, max_new_tokens, first_token_s, step_s,
                       forecast_draft(draft, prompt_ids, tokens, vocab_size))


def calibrate(target, draft, prompts: Sequence[data.Prompt], tokenizer, max_new_tokens: int) -> list[Calibration]:
    """The cheap measurements, per prompt: the target's greedy output with its prefill and step
    times (our AR loop, after one warm-up call), and one teacher-forced forward of the draft."""
    encoded = [data.encode(tokenizer, prompt, chat=True) for prompt in prompts]
    vocab_size = output_rows(target)
    autoregressive.generate(target, encoded[0], 4)  # the first calls pay one-off costs
    forecast_draft(draft, encoded[0], [0] * 4, vocab_size)
    found = []
    for prompt, prompt_ids in zip(tqdm(prompts, desc="picker: calibration"), encoded):
        ar = autoregressive.generate(target, prompt_ids, max_new_tokens)
        found.append(calibration(prompt, prompt_ids, ar.tokens, ar.time_to_first_token_s, ar.wall_time_s,
                                 max_new_tokens, draft, vocab_size))
    return found


def calibrations_from_rows(ar_rows: pd.DataFrame, prompts: dict, tokenizer, draft, vocab_size: int,
                           max_new_tokens: int) -> list[Calibration]:
    """Calibrations from a benchmark's target-AR rows (their greedy text and times), one draft
    forecast each: the picker's model on prompts whose speedups were measured."""
    return [calibration(prompts[row.prompt_id], data.encode(tokenizer, prompts[row.prompt_id], chat=True),
                        list(row.tokens), row.time_to_first_token_s, row.wall_time_s, max_new_tokens, draft, vocab_size)
            for row in tqdm(list(ar_rows.itertuples()), desc="picker: same-prompt check")]


def measure_costs(target, draft_cost_ratio: float, max_n: int, repeats: int = 5, draft=None,
                  max_draft_n: int = 0, draft_prefill_ratio: float = 0.0) -> Costs:
    """T(n) / T(1) of the target for n up to `max_n` (the longest verification a source can ask),
    from the nondecreasing fit of the medians (`hardware.forward_cost_curve`); with a `draft`, its
    own T(n) / T(1) up to `max_draft_n` (a tree level's forward)."""
    n_values = sorted({1, 2, 3, 4, 5, 6, 8, 11, 16, 21, 32, max_n} & set(range(1, max_n + 1)))
    curve = hardware.forward_cost_curve(target, n_values, prefix_tokens=100, repeats=repeats)
    relative_draft = None
    if draft is not None and max_draft_n > 1:
        draft_n = sorted({1, 2, 3, 4, 6, 8, 12, 16, max_draft_n} & set(range(1, max_draft_n + 1)))
        relative_draft = hardware.forward_cost_curve(draft, draft_n, prefix_tokens=100,
                                                     repeats=repeats).set_index("n").relative_to_one
    return Costs(curve.set_index("n").relative_to_one, draft_cost_ratio, relative_draft, draft_prefill_ratio)


def draft_agreement(calibrations: Sequence[Calibration]) -> float:
    """Per-position agreement of the draft's argmax with the target's greedy token, teacher-forced,
    pooled over the calibration prompts: Leviathan's alpha for a greedy draft."""
    hits = total = 0
    for cal in calibrations:
        predicted = cal.forecast.argmax[:len(cal.continuation)]
        hits += sum(a == b for a, b in zip(predicted, cal.continuation))
        total += len(cal.continuation)
    return hits / total if total else float("nan")


def predict(calibrations: Sequence[Calibration], listed: Sequence[Candidate], costs: Costs) -> pd.DataFrame:
    """One row per (source, prompt): the source's record as columns, tokens per target forward and
    the predicted speedup over AR."""
    records = []
    for cal in calibrations:
        ar_time = cal.prefill_s + (len(cal.continuation) - 1) * cal.step_s
        for item in listed:
            run = replay(item.make(cal.forecast), cal.prompt_ids, cal.continuation, cal.max_new_tokens)
            method_time = predicted_time(run, cal.prefill_s, cal.step_s, cal.forecast.prefill_s, costs)
            records.append({"source": item.name, **source_columns(item.source),
                            "implementation": item.source.implementation, "prompt_id": cal.prompt_id,
                            "category": cal.category,
                            "tokens_per_target_forward": len(cal.continuation) / len(run.proposed),
                            "predicted_speedup": ar_time / method_time})
    return pd.DataFrame(records)


def per_category(predictions: pd.DataFrame) -> pd.DataFrame:
    """Per (category, source): predicted speedup (geometric mean over the calibration prompts), with
    the source's record as columns."""
    described = [*source_columns(None), "implementation"]
    return (predictions.groupby(["category", "source"], sort=False)
            .agg(predicted_speedup=("predicted_speedup", metrics.geometric_mean),
                 tokens_per_target_forward=("tokens_per_target_forward", "mean"),
                 prompts=("prompt_id", "nunique"), **{column: (column, "first") for column in described})
            .reset_index())


def recommend(table: pd.DataFrame) -> pd.DataFrame:
    """Per category, our source with the highest predicted speedup (below 1 when the picker expects
    plain AR to be faster than any of them)."""
    ours = table[table.implementation == "ours"]
    best = ours.loc[ours.groupby("category", sort=False).predicted_speedup.idxmax()]
    return best.reset_index(drop=True)
