"""The content of one engine step: explicit prefill chunks and decodes.

The built-in scheduler produces a `StepPlan`; an external planner (FluidToken) can build one
itself and hand it to `LLMEngine.run_step`. Both go through the same runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrefillChunk:
    """Compute the next `num_tokens` uncomputed tokens of a request (a prompt chunk)."""

    request_id: str
    num_tokens: int


@dataclass
class StepPlan:
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[str] = field(default_factory=list)  # request ids, one token each

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + len(self.decodes)

    def __bool__(self) -> bool:
        return bool(self.prefills) or bool(self.decodes)
