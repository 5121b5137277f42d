"""The last minute of a running cluster, as an operator watches it (`fluidpd top`): PPI and DPI
samples, finished requests against the SLOs, every inter-token gap, refusals and failures."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.core.request import Request


@dataclass(slots=True)
class RecentWindow:
    """Samples of the last `span_s` seconds (the pressure indices: of the last `history_s`)."""

    slo: Slo
    span_s: float = 60.0
    history_s: float = 120.0
    pressure: deque = field(default_factory=deque)  # (t, ppi, dpi)
    finished: deque = field(default_factory=deque)  # (t, ttft, joint ok, strict ok, tokens)
    gaps: deque = field(default_factory=deque)  # (t, gap, weight)
    refused: deque = field(default_factory=deque)  # t of each 429
    failed: deque = field(default_factory=deque)  # t of each request that ended in an error

    def sample(self, now: float, ppi: float, dpi: float) -> None:
        self.pressure.append((now, ppi, dpi))
        _trim(self.pressure, now - self.history_s)

    def on_finish(self, now: float, req: Request) -> None:
        ttft = req.ttft_s
        ok = ttft <= self.slo.ttft_s
        joint, strict = ok and req.tpot_s <= self.slo.tbt_s, ok and req.p99_gap_within()
        self.finished.append((now, ttft, joint, strict, req.generated))
        _trim(self.finished, now - self.span_s)

    def on_gap(self, now: float, gap_s: float, weight: float) -> None:
        self.gaps.append((now, gap_s, weight))
        if len(self.gaps) % 256 == 0:
            _trim(self.gaps, now - self.span_s)

    def on_refused(self, now: float) -> None:
        self.refused.append(now)
        _trim(self.refused, now - self.span_s, key=None)

    def on_failed(self, now: float) -> None:
        self.failed.append(now)
        _trim(self.failed, now - self.span_s, key=None)

    def summary(self, now: float) -> dict:
        since = now - self.span_s
        done = [f for f in self.finished if f[0] >= since]
        gaps = [(g, w) for t, g, w in self.gaps if t >= since]
        ttft = [f[1] for f in done]
        n = len(done)
        return {
            "window_s": self.span_s,
            "finished": n,
            "ttft_p50_s": _quantile(ttft, 0.50),
            "ttft_p99_s": _quantile(ttft, 0.99),
            "tbt_p50_s": _weighted_quantile(gaps, 0.50),
            "tbt_p99_s": _weighted_quantile(gaps, 0.99),
            "attainment": sum(f[2] for f in done) / n if n else None,
            "strict_attainment": sum(f[3] for f in done) / n if n else None,
            "tokens_per_s": sum(f[4] for f in done) / self.span_s,
            "refused": sum(1 for t in self.refused if t >= since),
            "failed": sum(1 for t in self.failed if t >= since),
        }

    def history(self) -> dict:
        return {
            "t_s": [p[0] for p in self.pressure],
            "ppi": [p[1] for p in self.pressure],
            "dpi": [p[2] for p in self.pressure],
        }


@dataclass(slots=True)
class WindowedMetrics(MetricsCollector):
    """A MetricsCollector that also feeds a RecentWindow on `clock`'s time."""

    recent: RecentWindow | None = None
    clock: object = None  # anything with .now

    def on_gap(self, gap_s: float, weight: float = 1.0, handoff: bool = False) -> None:
        MetricsCollector.on_gap(self, gap_s, weight, handoff)
        if self.recent is not None and weight > 0:
            self.recent.on_gap(self.clock.now, gap_s, weight)  # type: ignore[attr-defined]

    def on_finish(self, req: Request) -> None:
        MetricsCollector.on_finish(self, req)
        if self.recent is not None:
            self.recent.on_finish(self.clock.now, req)  # type: ignore[attr-defined]


def _trim(d: deque, before: float, key=0) -> None:
    while d and (d[0] if key is None else d[0][key]) < before:
        d.popleft()


def _quantile(xs: list[float], q: float) -> float | None:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.quantile(xs, q)) if xs else None


def _weighted_quantile(samples: list[tuple[float, float]], q: float) -> float | None:
    if not samples:
        return None
    arr = np.array(sorted(samples))
    cum = np.cumsum(arr[:, 1])
    return float(arr[min(int(np.searchsorted(cum, q * cum[-1])), len(arr) - 1), 0])
