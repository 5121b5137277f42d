"""FluidToken's knobs (`fluidpd.policy.fluidtoken`): chunk bounds, borrowing limits, the guard band."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FluidTokenConfig:
    """Knobs of the micro engine."""

    min_chunk: int = 16  # a chunk smaller than this is not worth borrowing for
    max_chunk: int = 8192
    borrowed_per_worker: int = 1  # requests a decode worker holds for borrowing at once
    kv_headroom: float = 0.2  # most of its KV a decode worker keeps free for hand-offs when borrowing
    split_min_tokens: int = 2048  # prompts this long spread over several decode workers
    max_split: int = 4  # at most this many pieces
    guard_factor: float = 1.5  # delta_guard = factor x p99.9 of measured jitter
    guard_default_s: float | None = None  # until enough steps are measured: 10% of SLO_TBT (4 ms at 40 ms)
    overrun_quantile: float = 0.99  # a mixed step x this quantile of measured / planned stays within SLO_TBT
    overrun_prior: float = 1.5  # until a worker's mixed steps are measured, its chunks cost this x the model

    def __post_init__(self) -> None:
        if not 1 <= self.min_chunk <= self.max_chunk or self.borrowed_per_worker < 1:
            raise ValueError("need 1 <= min_chunk <= max_chunk and borrowed_per_worker >= 1")
        if not 0 <= self.kv_headroom <= 1:
            raise ValueError("kv_headroom must be in [0, 1]")
        if self.max_split < 1 or self.split_min_tokens < 2:
            raise ValueError("max_split must be >= 1 and split_min_tokens >= 2")
        if self.guard_factor <= 0 or (self.guard_default_s is not None and self.guard_default_s < 0):
            raise ValueError("guard_factor must be > 0 and guard_default_s >= 0")
        if not 0 < self.overrun_quantile <= 1 or self.overrun_prior < 1:
            raise ValueError("overrun_quantile must be in (0, 1] and overrun_prior >= 1")
