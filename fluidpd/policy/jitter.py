"""Measured step-time jitter per worker, and the FluidToken guard derived from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class JitterTracker:
    """Positive residuals of decode step times over their running estimate, in log buckets.

    delta_guard = factor x the `quantile` residual (the seed: 1.5 x the p99.9 tail), recomputed
    every `refresh` samples; `default_s` until `min_samples` have been seen.
    """

    factor: float = 1.5
    quantile: float = 0.999
    default_s: float = 0.003
    min_samples: int = 32
    refresh: int = 64
    lo_s: float = 1e-6
    buckets_per_decade: int = 40
    counts: list = field(default_factory=lambda: [0] * 240)  # 1 us .. 1 s
    samples: int = 0
    _guard: float = -1.0

    def observe(self, residual_s: float) -> None:
        self.samples += 1
        if residual_s > self.lo_s:
            i = int(math.log10(residual_s / self.lo_s) * self.buckets_per_decade)
            self.counts[min(i, len(self.counts) - 1)] += 1
        else:
            self.counts[0] += 1
        if self.samples % self.refresh == 0:
            self._guard = -1.0

    def tail_s(self) -> float:
        """The `quantile` of observed residuals (upper bucket edge: conservative)."""
        target = self.quantile * self.samples
        cum = 0
        for i, c in enumerate(self.counts):
            cum += c
            if cum >= target:
                return self.lo_s * 10 ** ((i + 1) / self.buckets_per_decade) if i else self.lo_s
        return self.lo_s * 10 ** (len(self.counts) / self.buckets_per_decade)

    @property
    def guard_s(self) -> float:
        if self.samples < self.min_samples:
            return self.default_s
        if self._guard < 0:
            self._guard = self.factor * self.tail_s()
        return self._guard
