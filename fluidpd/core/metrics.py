"""Serving metrics: TTFT, every inter-token gap, TPOT, end-to-end latency, SLO attainment."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import numpy as np

from fluidpd.core.histogram import StreamingHistogram
from fluidpd.core.request import Request

GAP_BUFFER = 4096  # inter-token gaps buffered before the histograms take them


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives: time to first token and time between tokens (seconds)."""

    ttft_s: float
    tbt_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tbt_s > 0):
            raise ValueError("SLOs must be positive (seconds)")


@dataclass(slots=True)
class MetricsCollector:
    """Collects per-request outcomes and streaming histograms of TTFT and inter-token gaps."""

    slo: Slo
    ttft: array = field(default_factory=lambda: array("d"))
    tpot: array = field(default_factory=lambda: array("d"))
    e2e: array = field(default_factory=lambda: array("d"))
    strict_ok: int = 0
    rejected: int = 0
    failed: int = 0  # accepted, then failed (e.g. refused by its engine)
    output_tokens: int = 0
    first_arrival_s: float = math.inf
    last_finish_s: float = 0.0
    finished: list | None = None  # keep finished Request objects (tests, small runs)
    # inter-token gaps (all; and without hand-off gaps), fed in order from a buffer of the recent ones
    _tbt: StreamingHistogram = field(default_factory=StreamingHistogram, init=False, repr=False)
    _tbt_decode: StreamingHistogram = field(default_factory=StreamingHistogram, init=False, repr=False)
    _gaps: list[float] = field(default_factory=list, init=False, repr=False)
    _weights: list[float] = field(default_factory=list, init=False, repr=False)
    _handoffs: list[int] = field(default_factory=list, init=False, repr=False)  # their buffer indexes

    def on_gap(self, gap_s: float, weight: float = 1.0, handoff: bool = False) -> None:
        """`weight` requests each saw an inter-token gap of `gap_s`; a hand-off gap spans a KV
        move between workers (prefill -> decode or a migration). Buffered (the simulator reports
        a gap every step); the histograms take the samples in order when read or every GAP_BUFFER."""
        if weight > 0:
            gaps = self._gaps
            if handoff:
                self._handoffs.append(len(gaps))
            gaps.append(gap_s)
            self._weights.append(weight)
            if len(gaps) >= GAP_BUFFER:
                self._fold_gaps()

    def _fold_gaps(self) -> None:
        gaps, weights, handoffs = self._gaps, self._weights, self._handoffs
        buckets = self._tbt.buckets(gaps)  # both histograms have the same buckets
        self._tbt.add_seq(gaps, weights, buckets)
        if handoffs:
            skip = set(handoffs)
            keep = [i for i in range(len(gaps)) if i not in skip]
            self._tbt_decode.add_seq([gaps[i] for i in keep], [weights[i] for i in keep], [buckets[i] for i in keep])
        else:
            self._tbt_decode.add_seq(gaps, weights, buckets)
        self._gaps, self._weights, self._handoffs = [], [], []

    @property
    def tbt(self) -> StreamingHistogram:
        """Every inter-token gap."""
        if self._gaps:
            self._fold_gaps()
        return self._tbt

    @property
    def tbt_decode(self) -> StreamingHistogram:
        """Inter-token gaps but the hand-off ones."""
        if self._gaps:
            self._fold_gaps()
        return self._tbt_decode

    def on_finish(self, req: Request) -> None:
        ttft, tpot = req.ttft_s, req.tpot_s
        self.ttft.append(ttft)
        self.tpot.append(tpot)
        self.e2e.append(req.finish_s - req.arrival_s)
        self.output_tokens += req.output_len * req.n  # (a request group: every sequence)
        if self.finished is not None:
            self.finished.append(req)
        self.first_arrival_s = min(self.first_arrival_s, req.arrival_s)
        self.last_finish_s = max(self.last_finish_s, req.finish_s)
        if ttft <= self.slo.ttft_s and req.p99_gap_within():
            self.strict_ok += 1

    @property
    def completed(self) -> int:
        return len(self.ttft)

    def joint_ok(self) -> int:
        """Requests meeting DistServe's joint SLO: TTFT <= SLO_TTFT and mean TPOT <= SLO_TBT."""
        if not self.ttft:
            return 0
        ttft = np.frombuffer(self.ttft, dtype=np.float64)
        tpot = np.frombuffer(self.tpot, dtype=np.float64)
        return int(np.count_nonzero((ttft <= self.slo.ttft_s) & (tpot <= self.slo.tbt_s)))

    def summary(self, requests: int) -> dict:
        """Aggregates over `requests` submitted ones (unfinished requests count as misses)."""
        ttft = np.frombuffer(self.ttft, dtype=np.float64) if self.ttft else np.array([math.nan])
        tpot = np.frombuffer(self.tpot, dtype=np.float64) if self.tpot else np.array([math.nan])
        e2e = np.frombuffer(self.e2e, dtype=np.float64) if self.e2e else np.array([math.nan])
        span = self.last_finish_s - self.first_arrival_s if self.completed else math.nan
        denom = max(requests, 1)
        return {
            "requests": requests,
            "completed": self.completed,
            "rejected": self.rejected,
            "failed": self.failed,
            "attainment": self.joint_ok() / denom,
            "strict_attainment": self.strict_ok / denom,
            "ttft_p50_s": float(np.percentile(ttft, 50)),
            "ttft_p90_s": float(np.percentile(ttft, 90)),
            "ttft_p99_s": float(np.percentile(ttft, 99)),
            "tbt_p50_s": self.tbt.quantile(0.50),
            "tbt_p90_s": self.tbt.quantile(0.90),
            "tbt_p99_s": self.tbt.quantile(0.99),
            "tbt_decode_p99_s": self.tbt_decode.quantile(0.99),
            "tpot_mean_s": float(np.mean(tpot)),
            "e2e_p50_s": float(np.percentile(e2e, 50)),
            "e2e_p99_s": float(np.percentile(e2e, 99)),
            "throughput_tok_s": self.output_tokens / span if span and span > 0 else 0.0,
        }


def hit_rate(hits: int, queries: int) -> float:
    """Prefix-cache token hit rate: cached prompt tokens over prompt tokens looked up (0 when none)."""
    return hits / queries if queries else 0.0
