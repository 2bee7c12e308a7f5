"""The one result record every decoder returns, so one metrics module and one plot module serve all."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    peak_memory_bytes: int | None = None  # CPU: peak RSS while decoding; CUDA: max allocated
    text: str = ""
    extras: dict = field(default_factory=dict)  # method-specific details (Jacobi block stats, ...)

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
        return cls(**{key: value for key, value in record.items() if key in names})
