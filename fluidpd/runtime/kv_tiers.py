"""What the engines' KV tiers did, summed for the metrics: store traffic, occupancy, residency histograms.

The two histograms are vLLM's cache residency ones: how long a cached block sat before a request
took it again (`kv_block_reuse_gap_seconds`) and before it was evicted unused
(`kv_block_idle_before_evict_seconds`), by tier. When blocks are evicted sooner than they are asked
for again, the cache is too small for the traffic: the case for a second tier.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from fluidpd.engine.outputs import TRAFFIC, KVTierActivity

RESIDENCY_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


@dataclass(slots=True)
class Buckets:
    """A Prometheus histogram's state: counts per upper bound (the last: +Inf), sum, count."""

    bounds: tuple[float, ...] = RESIDENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(RESIDENCY_BUCKETS) + 1))
    sum: float = 0.0

    def add(self, samples: list[float]) -> None:
        for x in samples:
            self.counts[bisect.bisect_left(self.bounds, x)] += 1
            self.sum += x

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, +Inf last (prometheus_client's HistogramMetricFamily buckets)."""
        out, acc = [], 0
        for le, c in zip((*map(str, self.bounds), "+Inf"), self.counts):
            acc += c
            out.append((le, acc))
        return out


@dataclass(slots=True)
class KVTierMeter:
    """The engines' KV tier activity, summed since the runtime started."""

    traffic: KVTierActivity = field(default_factory=KVTierActivity)  # summed counters; occupancy at the last report
    reuse_gap: dict[str, Buckets] = field(default_factory=dict)  # tier -> histogram
    idle_before_evict: dict[str, Buckets] = field(default_factory=dict)

    def add(self, act: KVTierActivity | None) -> None:
        if act is None:
            return
        t = self.traffic
        for k in TRAFFIC:
            setattr(t, k, getattr(t, k) + getattr(act, k))
        if act.store_capacity_blocks:
            t.store_used_blocks, t.store_capacity_blocks = act.store_used_blocks, act.store_capacity_blocks
        for tier, xs in act.reuse_gaps_s.items():
            self.reuse_gap.setdefault(tier, Buckets()).add(xs)
        for tier, xs in act.idle_before_evict_s.items():
            self.idle_before_evict.setdefault(tier, Buckets()).add(xs)

    def store_json(self, path: str) -> dict:
        """/v1/admin/cluster's `kv_store`."""
        t = self.traffic
        used, cap = t.store_used_blocks, t.store_capacity_blocks
        head = {"path": path, "capacity_blocks": cap, "used_blocks": used, "usage_perc": used / cap if cap else 0.0}
        return head | {k: getattr(t, k) for k in TRAFFIC}
