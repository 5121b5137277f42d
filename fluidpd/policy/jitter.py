"""Measured step-time jitter per worker, and the FluidToken guard derived from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class JitterTracker:
    """Positive residuals of decode step times over their running estimate, in log buckets.

    delta_guard = factor x the `quantile` residual (the seed: 1.5 x the p99.9 tail), computed when
    `min_samples` have been seen and every `refresh` samples after; `default_s` before. Reading it
    changes nothing.
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
        if self.samples == self.min_samples or (self.samples > self.min_samples and self.samples % self.refresh == 0):
            self._guard = self.factor * self.tail_s()

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
        return self._guard if self.samples >= self.min_samples else self.default_s


@dataclass(slots=True)
class OverrunTracker:
    """How far mixed steps (decodes plus prefill chunks) ran over the planner's estimate, as ratios.

    `factor` is the `quantile` of measured / estimated over the last `window` mixed steps (nearest
    rank, rounded up: with fewer than 100 steps, their largest); `ready` once `min_samples` are in.
    """

    quantile: float = 0.99
    min_samples: int = 8
    window: int = 128
    ratios: list = field(default_factory=list)
    _next: int = 0
    _factor: float = -1.0

    def observe(self, measured_s: float, estimate_s: float) -> None:
        if estimate_s <= 0:
            return
        r = measured_s / estimate_s
        if len(self.ratios) < self.window:
            self.ratios.append(r)
        else:
            self.ratios[self._next] = r
            self._next = (self._next + 1) % self.window
        self._factor = -1.0

    @property
    def ready(self) -> bool:
        return len(self.ratios) >= self.min_samples

    @property
    def factor(self) -> float:
        """The step-time factor (>= 1) a mixed step must stay within SLO_TBT under (1 until measured)."""
        n = len(self.ratios)
        if not n:
            return 1.0
        if self._factor < 0:
            self._factor = max(1.0, sorted(self.ratios)[min(n - 1, math.ceil(self.quantile * n) - 1)])
        return self._factor
