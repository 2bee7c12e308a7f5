"""The records that describe a decoding method: what it is (lossless or not, its role, whose
implementation, its candidate source and the weights it runs) and how to run it. Line-ups, the
benchmark, the picker, metrics, plots and the summary read these attributes; nothing parses a
display name or reads a method's settings back by string key.

- `CandidateSource`: where a method's guessed tokens come from (a draft model, prompt lookup, the
  hybrid, lookahead's n-gram pool, Jacobi iterations) and the settings that make it what it is.
- `Weights`: which quantization of which model a method runs (notebook 03's variants and pairs).
- `Method`: the two above, plus the callable and the declared `lossless` and `role`.

A result row carries every field of the first two as a plain column (`Method.labels`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from specdec_lab.result import GenerationResult

ROLES = (
    "target AR",  # plain autoregressive decoding of the target: the baseline of every speedup
    "draft AR",  # autoregressive decoding of the draft (for the cost ratio c)
    "speculative",  # a candidate source + target verification (draft model, prompt lookup)
    "parallel",  # Jacobi and lookahead decoding: the target guesses several of its own tokens a pass
    "lossy",  # returns another model's text in place of the target's (draft-then-score)
)
IMPLEMENTATIONS = ("ours", "transformers", "llama.cpp", "arctic-inference", "vllm")  # whose decode loop (arctic-inference: whose suffix tree)
# whose forward passes and KV cache: the kit's decoders run on the first two (decoders.backend); vLLM runs its own loop
ENGINES = ("transformers", "llama.cpp", "vllm")
SOURCE_KINDS = ("draft model", "draft model, other tokenizer", "prompt lookup", "suffix", "hybrid", "lookahead", "jacobi")
SCHEDULES = ("constant", "heuristic")  # draft-length schedules: k fixed, or transformers' +2 / -1 heuristic
MATCH_RULES = ("longest", "latest", "first")  # which earlier occurrence prompt lookup continues


@dataclass(frozen=True)
class HybridSettings:
    """The hybrid candidate source's defaults the draft picker chooses among (`HybridCandidates`
    takes them as its arguments of the same names)."""

    prior_acceptance: float = 0.6  # the draft's acceptance assumed before any evidence
    extend_lookups: bool = True  # a lookup that runs out is continued by the draft
    # the suffix trees' trust starts as if this many of their expected tokens had been accepted as expected: few,
    # and a rejected tree or two stops trees taken at face value (counts over few occurrences); many, and one
    # rejected tree at a request's start does not hand the rest of a code answer to the draft
    suffix_prior_tokens: float = 2.0
    # the draft's proposals: this tree (`shape_label` of the picker's Sequoia shape, which may be a chain), filled as
    # the line-up's draft tree is; None: the draft's adaptive chain
    draft_tree: str | None = None

    def draft_tree_shape(self) -> list[tuple[int, int]] | None:
        """The draft's tree as (parent, rank) per node (`parse_shape`), or None for its chain."""
        return parse_shape(self.draft_tree) if self.draft_tree else None

    def label(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in asdict(self).items() if value is not None)


@dataclass(frozen=True)
class LookaheadConfig:
    """Lookahead decoding's window W, n-gram size N and G candidate n-grams verified a pass (None:
    G = W, the paper's default), and whether the prompt's own n-grams seed the pool."""

    window: int
    ngram_size: int
    candidates: int | None = None
    pool_from_prompt: bool = False

    def __post_init__(self):
        if self.candidates is None:
            object.__setattr__(self, "candidates", self.window)

    @classmethod
    def from_mapping(cls, config) -> "LookaheadConfig":
        """From a parameter file's {window, ngram_size, candidates?, pool_from_prompt?}."""
        return config if isinstance(config, cls) else cls(**config)

    @property
    def tokens_per_pass(self) -> int:
        """Tokens in one steady-state pass: the current token, the full window, G full n-grams."""
        return 1 + (self.window + self.candidates) * (self.ngram_size - 1)

    def label(self) -> str:
        """W, N, G as the paper names them, and whether the prompt's n-grams seed the pool."""
        return (f"W={self.window} N={self.ngram_size} G={self.candidates}"
                + (" + prompt n-grams" if self.pool_from_prompt else ""))


@dataclass(frozen=True)
class SuffixSettings:
    """Suffix decoding's rules (`decoders.suffix`; vLLM's defaults): suffix trees `max_depth` tokens deep;
    a proposal of at most `spec_factor` * match length + `spec_offset` tokens, each at least
    `min_token_prob` probable (the cut by T(n) is the source's `cost_sized`)."""

    max_depth: int = 24
    spec_factor: float = 1.0
    spec_offset: float = 0.0
    min_token_prob: float = 0.1

    def __post_init__(self):
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int) or self.max_depth < 2:
            raise ValueError(f"suffix decoding's max_depth must be an integer >= 2, got {self.max_depth!r} (e.g. 24)")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"suffix decoding's min_token_prob must be in [0, 1], got {self.min_token_prob}")
        if self.spec_factor < 0 or self.spec_offset < 0:
            raise ValueError(f"suffix decoding's spec_factor and spec_offset must be >= 0, got "
                             f"{self.spec_factor}, {self.spec_offset}")

    def label(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in asdict(self).items())


@dataclass(frozen=True)
class TreeSettings:
    """A token tree's shape (`decoders.trees`); its depth is the source's k. At most `nodes` tokens
    are verified a step. `branching`: a draft tree's children per node, a prompt-lookup tree's merged
    matches. `beam`: a dynamic draft tree's nodes grown a level (EAGLE-2). `shape`: a fixed draft tree
    (Sequoia's, sized by the picker), written by `shape_label`."""

    nodes: int
    branching: int | None = None
    beam: int | None = None
    shape: str | None = None

    def label(self) -> str:
        if self.shape is not None:
            return f"tree of {self.nodes} nodes, <= {self.branching} children, sized by the picker"
        if self.branching is None:
            return f"tree <= {self.nodes} nodes"
        grown = f", {self.beam} grown a level" if self.beam is not None else ""
        what = "children" if self.beam is not None else "matches"
        return f"tree <= {self.nodes} nodes, {self.branching} {what}{grown}"


def shape_label(shape) -> str:
    """A fixed tree's (parent, rank) nodes as one string, e.g. "-1:0 -1:1 0:0" (a row's column)."""
    return " ".join(f"{parent}:{rank}" for parent, rank in shape)


def parse_shape(label: str) -> list[tuple[int, int]]:
    """`shape_label`'s inverse."""
    try:
        return [(int(parent), int(rank)) for parent, rank in (node.split(":") for node in label.split())]
    except ValueError:
        raise ValueError(f"a tree shape is 'parent:rank' per node, e.g. '-1:0 -1:1 0:0', got {label!r}") from None


@dataclass(frozen=True)
class CandidateSource:
    """What proposes the tokens a method verifies, with every setting that changes its proposals.
    Fields a kind does not use stay None. Two methods with equal records propose alike, so the
    picker's predictions and the line-up's measurements are joined on this record."""

    kind: str
    implementation: str = "ours"
    k: int | None = None  # tokens proposed a step (the start of an adaptive schedule)
    schedule: str | None = None  # a draft length's schedule, one of SCHEDULES
    confidence_threshold: float | None = None  # the draft stops below this top probability (0: never)
    match: str | None = None  # prompt lookup's rule, one of MATCH_RULES
    max_ngram: int | None = None  # prompt lookup's longest n-gram
    prompt_lookup_k: int | None = None  # the hybrid's lookup length
    hybrid: HybridSettings | None = None
    lookahead: LookaheadConfig | None = None
    tree: TreeSettings | None = None  # a draft model or prompt lookup proposing token trees (depth: k)
    suffix: SuffixSettings | None = None  # suffix decoding's rules (k: its tokens a step, a tree's nodes)
    # a model-free source's proposals (prompt lookup, the hybrid's lookups, suffix decoding) cut to the tokens worth
    # verifying at the target's measured T(n) (`cost_model.nodes_worth_verifying`; vLLM has no such rule)
    cost_sized: bool | None = None
    block_size: int | None = None  # Jacobi's block
    init: str | None = None  # Jacobi's initial guess

    def __post_init__(self):
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"unknown candidate source kind {self.kind!r}: use one of {SOURCE_KINDS}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {self.implementation!r}: use one of {IMPLEMENTATIONS}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise ValueError(f"unknown draft-length schedule {self.schedule!r}: use one of {SCHEDULES}")
        if self.match is not None and self.match not in MATCH_RULES:
            raise ValueError(f"unknown prompt-lookup match rule {self.match!r}: use one of {MATCH_RULES}")


NESTED = {"hybrid": HybridSettings, "lookahead": LookaheadConfig, "tree": TreeSettings, "suffix": SuffixSettings}  # source fields that are records
INTEGER_COLUMNS = {"k", "max_ngram", "prompt_lookup_k", "block_size", "lookahead_window", "lookahead_ngram_size",
                   "lookahead_candidates", "tree_nodes", "tree_branching", "tree_beam", "suffix_max_depth"}  # read back as ints (a frame with missing values holds them as floats)


def column_name(field_name: str) -> str:
    """A source field's row column: `source_kind` for the kind, the field's own name otherwise."""
    return "source_kind" if field_name == "kind" else field_name


def source_columns(source: CandidateSource | None) -> dict:
    """Every column a source record gives a row (all None for a method without one, plain AR, so
    every row of a frame has the same columns): `source_kind`, `k`, `schedule`, ..., and the
    nested settings prefixed with their field's name (`hybrid_prior_acceptance`, `lookahead_window`).
    The implementation is the method's own column."""
    columns = {}
    for item in fields(CandidateSource):
        value = getattr(source, item.name) if source is not None else None
        if item.name == "implementation":
            continue
        if item.name in NESTED:
            columns.update({f"{item.name}_{sub.name}": getattr(value, sub.name) if value is not None else None
                            for sub in fields(NESTED[item.name])})
        else:
            columns[column_name(item.name)] = value
    return columns


def source_from_columns(columns, implementation: str) -> CandidateSource | None:
    """The record back from a row's or a table line's columns (`source_columns`' inverse; None for a
    method without a source). Missing values read as None, whole numbers as ints."""
    def value(name):
        found = columns.get(name) if hasattr(columns, "get") else getattr(columns, name, None)
        if found is None or (isinstance(found, float) and math.isnan(found)):
            return None
        return int(found) if isinstance(found, float) and found.is_integer() and name in INTEGER_COLUMNS else found

    if value("source_kind") is None:
        return None
    plain = {item.name: value(column_name(item.name)) for item in fields(CandidateSource)
             if item.name not in NESTED and item.name != "implementation"}
    nested = {name: record(**{sub.name: value(f"{name}_{sub.name}") for sub in fields(record)})
              for name, record in NESTED.items() if value(f"{name}_{fields(record)[0].name}") is not None}
    return CandidateSource(implementation=implementation, **plain, **nested)


def short_label(source: CandidateSource | None, role: str, implementation: str = "ours") -> str:
    """A few words for a narrow table or a token view: the source's kind and its main setting, and
    whose loop it is when not the kit's ("draft k=5 · transformers")."""
    if source is None:
        text = {"target AR": "AR", "draft AR": "draft AR", "lossy": "draft-then-score"}.get(role, role)
    elif source.kind == "suffix":
        text = f"suffix {'tree' if source.tree is not None else 'path'} k={source.k}"
    elif source.tree is not None:
        text = f"{'lookup' if source.kind == 'prompt lookup' else 'draft'} tree ({source.tree.nodes} nodes)"
    elif source.kind in ("draft model", "draft model, other tokenizer"):
        text = ("draft" if source.kind == "draft model" else "other-tokenizer draft") + f" k={source.k}" + (
            " adaptive" if source.schedule == "heuristic" else "")
    elif source.kind == "prompt lookup":
        text = f"lookup k={source.k}" + (f" {source.match}" if source.match not in (None, "longest") else "")
    elif source.kind == "lookahead":
        text = f"lookahead {source.lookahead.label()}" if source.lookahead else "lookahead"
    elif source.kind == "jacobi":
        text = f"Jacobi n={source.block_size}"
    else:
        text = source.kind
    text += " cut" if source is not None and source.cost_sized else ""  # beside the same source uncut
    return text if implementation == "ours" else f"{text} · {implementation}"


@dataclass(frozen=True)
class Weights:
    """Which weights a method runs: the model's role, its quantization (of the target, for a pair)
    and, for a speculative pair, the draft's (`self_draft`: the draft is the target's own model)."""

    model_role: str = "target"
    quantization: str = "none"
    draft_quantization: str | None = None
    self_draft: bool | None = None

    def columns(self) -> dict:
        return asdict(self)


NO_WEIGHTS = {item.name: None for item in fields(Weights)}  # the columns of a method without Weights


@dataclass(frozen=True)
class Method:
    """`decode(prompt_ids) -> GenerationResult`; it builds any per-call state (a candidate
    generator's cache and draft length) itself, so nothing carries over from one prompt to the next.
    A batched method (notebook 05, `bench.run_batches`) decodes a batch: `decode([prompt_ids, ...])`
    returns one result per prompt.

    `lossless` is declared: the method's greedy output equals greedy AR of the *unquantized* target
    in exact arithmetic. The fp32 controls check the declaration; a declared-lossless method that
    disagrees there is a bug.
    """

    name: str  # what tables and plots show
    decode: Callable[[list[int]], GenerationResult]
    lossless: bool
    role: str
    implementation: str = "ours"
    source: CandidateSource | None = None
    weights: Weights | None = None
    engine: str = "transformers"

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r} for method {self.name!r}: use one of {ENGINES}")
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r} for method {self.name!r}: use one of {ROLES}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {self.implementation!r} for method {self.name!r}: "
                             f"use one of {IMPLEMENTATIONS}")
        if self.source is not None and self.source.implementation != self.implementation:
            raise ValueError(f"method {self.name!r} is implemented by {self.implementation!r} but its candidate "
                             f"source says {self.source.implementation!r}: give both the same implementation")

    def __call__(self, prompt_ids) -> GenerationResult:
        return self.decode(prompt_ids)

    @property
    def short_label(self) -> str:
        return short_label(self.source, self.role, self.implementation)

    def labels(self) -> dict:
        """What a result row records about the method: its declared properties, then its source's
        and its weights' fields as plain columns."""
        return {"decoder": self.name, "lossless": self.lossless, "role": self.role,
                "implementation": self.implementation, "engine": self.engine, **source_columns(self.source),
                **(self.weights.columns() if self.weights is not None else NO_WEIGHTS)}


def the_one(methods, role: str) -> Method:
    """The single method of a role in a line-up (e.g. its target AR baseline)."""
    found = [m for m in methods if m.role == role]
    if len(found) != 1:
        raise ValueError(f"expected exactly one {role!r} method, found {[m.name for m in found]}")
    return found[0]
