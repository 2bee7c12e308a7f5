"""The one result record every decoder returns, so one metrics module and one plot module serve all."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# --- where each generated token came from (the token views) --------------------------------------------
# The target's own token: an AR step, the bonus after every proposal of a step was accepted, or a step
# that proposed nothing.
TARGET = "target"
# The target's own token where a proposal (or a Jacobi guess) for that position was rejected.
CORRECTION = "correction"
# Accepted proposals, by candidate source.
DRAFT_MODEL = "draft model"
PROMPT_LOOKUP = "prompt lookup"
LOOKAHEAD_NGRAM = "lookahead n-gram"
SUFFIX = "suffix decoding"  # what followed an earlier occurrence in the prompt or in earlier answers
PROPOSAL = "proposal"  # a candidate source that does not name itself
# Jacobi: guesses the iteration confirmed beyond its first token; "stationary" ones were already right
# in an earlier iteration, while a token before them was still wrong (the CLLM paper's terms).
FAST_FORWARD = "fast-forwarded"
STATIONARY = "stationary"
# Draft-then-score: the draft's text, never verified token by token (not lossless).
UNVERIFIED_DRAFT = "unverified draft"
SIDE_BRANCH = ", side branch"  # appended to a tree's accepted token that was not its parent's first child
ACCEPTED_ORIGINS = (DRAFT_MODEL, PROMPT_LOOKUP, LOOKAHEAD_NGRAM, SUFFIX, PROPOSAL, FAST_FORWARD, STATIONARY)


def side_branch(origin: str) -> str:
    return origin + SIDE_BRANCH


def is_accepted_proposal(origin: str) -> bool:
    """A token the target accepted from a proposal or a guess (not one it wrote itself)."""
    return origin.removesuffix(SIDE_BRANCH) in ACCEPTED_ORIGINS


@dataclass
class BlockTrace:
    """The Jacobi trajectory of one block: the state fed to each iteration and where it converged
    (CLLM training data)."""

    start: int  # offset of the block's first token in the generated sequence
    states: list[list[int]]  # the whole block (fixed part + open guesses) as fed to each iteration
    fixed_per_iteration: list[int]  # tokens fixed by each iteration (>= 1)
    fixed_point: list[int]  # the converged block (shorter than the states if generation stopped inside)
    converged: bool


@dataclass
class JacobiBlock:
    """What one Jacobi block took: iterations to converge, tokens fixed beyond one per iteration
    (fast-forwarded), and tokens that were right early and stayed (stationary)."""

    iterations: int
    fast_forward: int
    stationary: int


@dataclass
class JacobiStats:
    block_size: int
    init: str
    blocks: list[JacobiBlock] = field(default_factory=list)
    traces: list[BlockTrace] | None = None  # every block's trajectory, when asked for (record_states)

    @classmethod
    def from_dict(cls, record: dict) -> "JacobiStats":
        traces = record.get("traces")
        return cls(record["block_size"], record["init"], [JacobiBlock(**b) for b in record["blocks"]],
                   None if traces is None else [BlockTrace(**t) for t in traces])


@dataclass
class GenerationResult:
    """What one decoding call produced and what it cost.

    A "step" is one forward pass of the target model after the prefill. For autoregressive decoding
    every step emits one token; for speculative decoding a step verifies `proposed_per_step[i]`
    draft tokens and keeps `accepted_per_step[i]` of them plus one token of the target's own;
    for Jacobi decoding a step is one parallel refinement of the block.
    """

    prompt_length: int
    tokens: list[int]  # generated token ids, prompt excluded, EOS included if produced
    accepted_per_step: list[int] = field(default_factory=list)  # draft/guessed tokens kept per step
    proposed_per_step: list[int] = field(default_factory=list)  # draft/guessed tokens checked per step
    target_forwards: int = 0  # forward passes of the target, prefill included
    draft_forwards: int = 0  # forward passes of a draft model (0 without one)
    # tokens fed to each target forward after the prefill, its n in T(n) (AR, Jacobi and lookahead record
    # it; empty where a decoder does not): a forward's measured time is set beside T(n) at this n
    forward_tokens: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    time_to_first_token_s: float = 0.0
    peak_memory_bytes: int | None = None  # peak while decoding above what was held at its start (RSS / CUDA allocated)
    jacobi: JacobiStats | None = None  # Jacobi decoding's per-block statistics
    extras: dict = field(default_factory=dict)  # other method-specific details (draft-then-score's score)
    # per generated token: where it came from (the origins above) and the target forward that yielded it
    # (0: the prefill). Empty where a decoder cannot say (the peers' own loops).
    token_origins: list[str] = field(default_factory=list)
    token_steps: list[int] = field(default_factory=list)

    def __post_init__(self):
        for name in ("token_origins", "token_steps"):
            labels = getattr(self, name)
            if labels and len(labels) != len(self.tokens):
                raise ValueError(f"{name} has {len(labels)} entries for {len(self.tokens)} tokens: a decoder "
                                 f"must label every generated token, or none")

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_second(self) -> float:
        """Tokens actually generated per second (not max_new_tokens / latency, as some blogs do)."""
        return self.num_tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")

    @property
    def tokens_per_target_forward(self) -> float:
        """Generated tokens per target forward pass; the prefill pass counts (it yields the first token)."""
        return self.num_tokens / self.target_forwards if self.target_forwards else float("nan")

    @property
    def acceptance_rate(self) -> float:
        proposed = sum(self.proposed_per_step)
        return sum(self.accepted_per_step) / proposed if proposed else float("nan")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> "GenerationResult":
        names = cls.__dataclass_fields__
        values = {key: value for key, value in record.items() if key in names}
        if isinstance(values.get("jacobi"), dict):
            values["jacobi"] = JacobiStats.from_dict(values["jacobi"])
        return cls(**values)
