"""The one result record every decoder returns, so one metrics module and one plot module serve all."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    wall_time_s: float = 0.0
    time_to_first_token_s: float = 0.0
    peak_memory_bytes: int | None = None  # peak while decoding above what was held at its start (RSS / CUDA allocated)
    jacobi: JacobiStats | None = None  # Jacobi decoding's per-block statistics
    extras: dict = field(default_factory=dict)  # other method-specific details (draft-then-score's score)

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
