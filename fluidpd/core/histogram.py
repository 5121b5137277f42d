"""Streaming log-bucketed histogram: quantiles of millions of samples in constant memory."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class StreamingHistogram:
    """Log-spaced buckets between `lo` and `hi` seconds; relative error about `rel_err`.

    The bucket counts are a Python list (one `add` is a float add, not a NumPy scalar round
    trip: the simulator adds a sample every step); `counts` is their array.
    """

    lo: float = 1e-5
    hi: float = 1e5
    rel_err: float = 0.005
    bins: list[float] = field(init=False)
    total: float = 0.0
    sum: float = 0.0
    max: float = 0.0
    _log_lo: float = field(init=False)
    _scale: float = field(init=False)
    _last: int = field(init=False)  # index of the last bucket (everything from `hi` up)

    def __post_init__(self) -> None:
        if not 0 < self.lo < self.hi or self.rel_err <= 0:
            raise ValueError("histogram needs 0 < lo < hi and rel_err > 0")
        self._log_lo = math.log(self.lo)
        self._scale = 1.0 / math.log1p(2 * self.rel_err)
        n = math.ceil((math.log(self.hi) - self._log_lo) * self._scale) + 2
        self.bins = [0.0] * n
        self._last = n - 1

    @property
    def counts(self) -> np.ndarray:
        """Samples (summed weights) per bucket."""
        return np.array(self.bins, dtype=np.float64)

    def add(self, x: float, weight: float = 1.0) -> None:
        i = 0 if x <= self.lo else int((math.log(x) - self._log_lo) * self._scale) + 1
        self.bins[i if i < self._last else self._last] += weight
        self.total += weight
        self.sum += x * weight
        if x > self.max:
            self.max = x

    def buckets(self, xs: list[float]) -> list[int]:
        """The bucket of each of `xs` as `add` finds it, before the clamp to the last one (the same
        for any histogram with these `lo`, `hi`, `rel_err`)."""
        log, log_lo, scale, lo = math.log, self._log_lo, self._scale, self.lo
        return [0 if x <= lo else int((log(x) - log_lo) * scale) + 1 for x in xs]

    def add_seq(self, xs: list[float], weights: list[float], buckets: list[int] | None = None) -> None:
        """`add` each (x, weight) pair in order, without a call per sample: the same result,
        float for float (the sum is accumulated in the same order). `buckets`: `buckets(xs)`."""
        if buckets is None:
            buckets = self.buckets(xs)
        bins, last, total, total_x, top = self.bins, self._last, self.total, self.sum, self.max
        for i, x, w in zip(buckets, xs, weights):
            bins[i if i < last else last] += w
            total += w
            total_x += x * w
            if x > top:
                top = x
        self.total, self.sum, self.max = total, total_x, top

    def add_many(self, xs: np.ndarray) -> None:
        xs = np.asarray(xs, dtype=np.float64)
        if xs.size == 0:
            return
        idx = np.ones(xs.shape, dtype=np.int64)
        pos = xs > self.lo
        idx[~pos] = 0
        idx[pos] = (np.log(xs[pos]) - self._log_lo) * self._scale + 1
        added = np.bincount(np.minimum(idx, self._last), minlength=len(self.bins))
        self.bins = [c + float(a) for c, a in zip(self.bins, added)]
        self.total += xs.size
        self.sum += float(xs.sum())
        self.max = max(self.max, float(xs.max()))

    def _value(self, i: int) -> float:
        if i == 0:
            return self.lo
        lo_edge = math.exp(self._log_lo + (i - 1) / self._scale)
        hi_edge = math.exp(self._log_lo + i / self._scale)
        return min(math.sqrt(lo_edge * hi_edge), self.max)

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1); NaN when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("quantile q must be in [0, 1]")
        if self.total == 0:
            return math.nan
        target = q * self.total
        cum = np.cumsum(self.counts)
        i = int(np.searchsorted(cum, target, side="left"))
        return self._value(min(i, self._last))

    @property
    def mean(self) -> float:
        return self.sum / self.total if self.total else math.nan

    def cdf_points(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, cumulative fraction) over the non-empty buckets, for CDF plots."""
        counts = self.counts
        nz = np.nonzero(counts)[0]
        values = np.array([self._value(int(i)) for i in nz])
        cum = np.cumsum(counts[nz]) / self.total if self.total else np.array([])
        return values, cum

    def merge(self, other: StreamingHistogram) -> None:
        if len(other.bins) != len(self.bins) or other.lo != self.lo:
            raise ValueError("can only merge histograms with the same buckets")
        self.bins = [a + b for a, b in zip(self.bins, other.bins)]
        self.total += other.total
        self.sum += other.sum
        self.max = max(self.max, other.max)
