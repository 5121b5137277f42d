"""The content of one engine step: explicit prefill chunks and decodes.

The built-in scheduler produces a `StepPlan`; an external planner (FluidToken) can build one
itself and hand it to `LLMEngine.run_step`. Both go through the same runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fluidpd.engine.sequence import Sequence  # plan stays torch-free


@dataclass(frozen=True)
class PrefillChunk:
    """Compute the next `num_tokens` uncomputed tokens of a request (a prompt chunk).

    `num_cached` (only for a request with nothing computed): its first `num_cached` tokens come
    from the engine's prefix cache; those the cache does not hold are computed in the same step,
    so the request has exactly `num_cached + num_tokens` computed tokens afterwards."""

    request_id: str
    num_tokens: int
    num_cached: int = 0


@dataclass
class StepPlan:
    """Prefill chunks and decodes to run in one forward pass."""

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


def resolve(plan: StepPlan, live: Callable[[str], Sequence]) -> list[tuple[Sequence, int, int]]:
    """(sequence, tokens to compute, leading tokens to take from the cache) for each entry of `plan`;
    ValueError when the plan does not fit the requests."""
    chunks = []
    for c in plan.prefills:
        seq = live(c.request_id)
        if c.num_cached < 0:
            raise ValueError(f"prefill chunk for {c.request_id!r}: num_cached must be >= 0, got {c.num_cached}")
        if c.num_cached and (seq.num_computed or seq.block_table):
            raise ValueError(
                f"prefill chunk for {c.request_id!r} has num_cached={c.num_cached}: only a request with "
                f"nothing computed can start from the cache (it has {seq.num_computed} computed)"
            )
        if not 1 <= c.num_tokens <= seq.num_uncomputed - c.num_cached:
            raise ValueError(
                f"prefill chunk of {c.num_tokens} tokens after {c.num_cached} cached for {c.request_id!r}, "
                f"which has {seq.num_uncomputed} uncomputed"
            )
        chunks.append((seq, c.num_tokens, c.num_cached))
    for rid in plan.decodes:
        seq = live(rid)
        if not seq.is_decoding:
            raise ValueError(f"request {rid!r} is not decoding ({seq.num_uncomputed} tokens uncomputed)")
        chunks.append((seq, 1, 0))
    if len({id(s) for s, _, _ in chunks}) != len(chunks):
        raise ValueError("a request appears twice in the step plan")
    return chunks
