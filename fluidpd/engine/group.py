"""A request with n > 1 inside an engine: one prompt prefill, then n sequences that share its KV blocks."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from fluidpd.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from fluidpd.engine.outputs import RequestOutput
    from fluidpd.engine.sequence import Sequence

SEED_MASK = (1 << 64) - 1


@dataclass(eq=False)
class SeqGroup:
    """One engine request id over a prompt `parent` (until the fork) and its live `children` by index.

    Before the fork the children hold no KV (their first tokens, if sampled, wait in their tokens);
    the fork gives each the prompt's full blocks (shared) and its own copy of the partial last one."""

    request_id: str
    n: int
    prompt_ids: list[int]
    parent: Sequence | None = None  # computes the prompt; None once forked
    children: dict[int, Sequence] = field(default_factory=dict)  # live ones
    done: dict[int, RequestOutput | None] = field(default_factory=dict)  # finished children (None: before this engine)
    resuming: set[int] = field(default_factory=set)  # children re-added with tokens, not sampled here yet
    detached: bool = False  # the parent computed its prompt and left the scheduler (its blocks wait for the fork)

    @property
    def forked(self) -> bool:
        return self.parent is None

    @property
    def finished(self) -> bool:
        return not self.children

    def live(self) -> list[Sequence]:
        return [self.children[j] for j in sorted(self.children)]


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child `index`'s params: seed s gives it s + index (vLLM v1's parallel sampling); no seed: a random one."""
    if params.seed is None or index == 0:
        return params
    return replace(params, seed=(params.seed + index) & SEED_MASK)
