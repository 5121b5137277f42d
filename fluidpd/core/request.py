"""A request's life as the control plane and both worlds (simulator, runtime) see it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Request:
    """One request: arrival, prefill progress, decode progress, and its token timeline.

    State machine (DistServe's runtime, extended by FluidPD):
        queued -> prefilling -> [held on a prefill worker -> pulled] -> decoding -> finished
    Preemption by recompute sends a request back to `queued` with `prefill_target`
    grown by the tokens it already generated; migration moves a decoding request's KV
    to a peer without losing or repeating a token.
    """

    id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    prefill_target: int = 0  # tokens to prefill: the prompt, or prompt + generated after a preemption
    prefilled: int = 0  # tokens of prefill_target whose KV is computed
    generated: int = 0  # output tokens emitted (the first one comes from prefill)
    first_token_s: float = math.nan
    last_token_s: float = math.nan
    finish_s: float = math.nan
    worker: int = -1  # where its KV lives
    gaps: int = 0  # inter-token gaps observed
    gaps_over: int = 0  # of which longer than SLO_TBT
    preemptions: int = 0
    migrations: int = 0
    borrowed: bool = False  # prefilled (partly) by FluidToken on a decode worker
    moved: bool = False  # its KV just arrived over a link: the next gap is a hand-off gap
    held_first: bool = False  # its first token waits for its first decode step (World.hold_first_token)
    # prefix caching: the ids (hashes) of its context's full blocks at the world's block size, prompt
    # first, then the answer where the workload knows it (empty: no reuse)
    block_hashes: Sequence[int] = field(default=())
    cached_tokens: int = 0  # prompt tokens whose prefill its first admission skipped (a cache hit)
    loaded_tokens: int = 0  # of those, loaded from the host tier
    kv_ready_s: float = 0.0  # its prefix loading from a host tier is in the arena from then on
    cache_queried: bool = False  # its first admission looked the cache up (recomputes are not counted)
    queued_hit: int = 0  # until it starts: cached tokens the worker whose queue holds it is expected to skip
    session: int = -1  # closed-loop session (-1: none)
    think_time_s: float = 0.0  # the pause after its session's previous request completed
    n: int = 1  # sequences sampled from one prefill (a request group: n decode rows sharing the prompt's KV)
    live: int = 0  # of those, still generating (0 on construction: n)
    constrained: bool = False  # a grammar masks its logits before each pick (structured outputs)

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"request {self.id}: prompt_len and output_len must be >= 1")
        if self.prefill_target == 0:
            self.prefill_target = self.prompt_len
        if self.n < 1:
            raise ValueError(f"request {self.id}: n must be >= 1")
        if self.live == 0:
            self.live = self.n

    @property
    def prefill_remaining(self) -> int:
        return self.prefill_target - self.prefilled

    @property
    def kv_prior(self) -> int:
        """Prompt tokens whose KV the next prefill chunk attends to."""
        return self.prefilled

    @property
    def context_len(self) -> int:
        """Tokens whose KV a decode step of this request reads."""
        return self.prompt_len + self.generated

    @property
    def remaining_tokens(self) -> int:
        return self.output_len - self.generated

    @property
    def finished(self) -> bool:
        return self.generated >= self.output_len

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (DistServe's TPOT); 0 for one-token outputs."""
        if self.output_len <= 1:
            return 0.0
        return (self.last_token_s - self.first_token_s) / (self.output_len - 1)

    def start_over(self) -> None:
        """Its KV is gone (preempted, or its worker lost): recompute the prompt plus every token
        already out (a group: each live sequence's); the first token, if it was still held back, goes
        out as it stands."""
        self.prefill_target = self.prompt_len + self.live * self.generated
        self.prefilled = 0
        self.kv_ready_s = 0.0
        self.held_first = False
        self.worker = -1

    def emit(self, now: float) -> None:
        """Record one emitted token at `now` (the gap is accounted by the caller)."""
        if self.generated == 0:
            self.first_token_s = now
        self.generated += 1
        self.last_token_s = now

    def add_gap(self, gap_s: float, slo_tbt_s: float) -> None:
        self.gaps += 1
        if gap_s > slo_tbt_s:
            self.gaps_over += 1

    def add_gaps(self, count: int, over: int) -> None:
        self.gaps += count
        self.gaps_over += over

    def p99_gap_within(self) -> bool:
        """True when this request's own P99 inter-token gap is within SLO_TBT (nearest rank)."""
        allowed = self.gaps - math.ceil(0.99 * self.gaps)
        return self.gaps_over <= allowed
