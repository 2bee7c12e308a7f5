"""The one record that describes a decoding method: what it is (lossless or not, its role, whose
implementation, its parameters) and how to run it. Line-ups, the benchmark, metrics, plots and the
summary read these attributes; nothing parses a display name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from specdec_lab.result import GenerationResult

ROLES = (
    "target AR",  # plain autoregressive decoding of the target: the baseline of every speedup
    "draft AR",  # autoregressive decoding of the draft (for the cost ratio c)
    "speculative",  # a candidate source + target verification (draft model, prompt lookup)
    "parallel",  # Jacobi and lookahead decoding: the target guesses several of its own tokens a pass
    "lossy",  # returns another model's text in place of the target's (draft-then-score)
)
IMPLEMENTATIONS = ("ours", "transformers", "llama.cpp")


@dataclass(frozen=True)
class Method:
    """`decode(prompt_ids) -> GenerationResult`; it builds any per-call state (a candidate
    generator's cache and draft length) itself, so nothing carries over from one prompt to the next.

    `lossless` is declared: the method's greedy output equals greedy AR of the *unquantized* target
    in exact arithmetic. The fp32 controls check the declaration; a declared-lossless method that
    disagrees there is a bug.
    """

    name: str  # what tables and plots show
    decode: Callable[[list[int]], GenerationResult]
    lossless: bool
    role: str
    implementation: str = "ours"
    params: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r} for method {self.name!r}: use one of {ROLES}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {self.implementation!r} for method {self.name!r}: "
                             f"use one of {IMPLEMENTATIONS}")

    def __call__(self, prompt_ids) -> GenerationResult:
        return self.decode(prompt_ids)

    def labels(self) -> dict:
        """What a result row records about the method."""
        return {"decoder": self.name, "lossless": self.lossless, "role": self.role,
                "implementation": self.implementation, "method_params": dict(self.params)}


def the_one(methods, role: str) -> Method:
    """The single method of a role in a line-up (e.g. its target AR baseline)."""
    found = [m for m in methods if m.role == role]
    if len(found) != 1:
        raise ValueError(f"expected exactly one {role!r} method, found {[m.name for m in found]}")
    return found[0]
