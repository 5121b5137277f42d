"""The KV tiers in Prometheus: hits by tier, the store's traffic and occupancy, and the residency
histograms (vLLM's reuse-gap and idle-before-evict) by tier, from a runtime's snapshot."""

from __future__ import annotations

from prometheus_client import generate_latest

from fluidpd.engine.outputs import KVTierActivity
from fluidpd.runtime.kv_tiers import KVTierMeter
from fluidpd.server.metrics import ServerMetrics
from tests.server.serverhelp import metric


class _Runtime:
    def __init__(self, snap: dict) -> None:
        self.snap = snap

    def metrics_snapshot(self) -> dict:
        return self.snap


def test_tier_hits_store_traffic_and_residency_histograms_are_exported():
    meter = KVTierMeter()
    meter.add(
        KVTierActivity(
            loaded_blocks=3,
            loaded_bytes=300,
            load_s=0.5,
            offloaded_blocks=4,
            offloaded_bytes=400,
            offload_s=0.25,
            checksum_failures=1,
            evicted_blocks=2,
            store_used_blocks=6,
            store_capacity_blocks=8,
            reuse_gaps_s={"store": [0.2, 40.0, 700.0], "device": [3.0]},
            idle_before_evict_s={"device": [90.0, 100.0]},
        )
    )
    meter.add(None)
    worker = {"id": 0, "prefix_cache_queries": 500, "prefix_cache_hits": 300, "prefix_cache_store_hits": 48}
    snap = {"workers": [worker], "kv_tiers": meter, "kv_store": meter.store_json("/dev/shm/x")}
    text = generate_latest(ServerMetrics(_Runtime(snap), "m").registry).decode()
    assert 'fluidpd:prefix_cache_tier_hits_total{model_name="m",tier="device",worker="0"} 252.0' in text
    assert 'fluidpd:prefix_cache_tier_hits_total{model_name="m",tier="store",worker="0"} 48.0' in text
    assert (
        metric(text, "fluidpd:kv_load_bytes_total") == 300 and metric(text, "fluidpd:kv_offload_seconds_total") == 0.25
    )
    assert (
        metric(text, "fluidpd:kv_store_usage_perc") == 0.75
        and metric(text, "fluidpd:kv_store_checksum_failures_total") == 1
    )
    assert 'fluidpd:kv_block_reuse_gap_seconds_bucket{le="60.0",model_name="m",tier="store"} 2.0' in text
    assert 'fluidpd:kv_block_reuse_gap_seconds_count{model_name="m",tier="store"} 3.0' in text
    assert 'fluidpd:kv_block_idle_before_evict_seconds_bucket{le="60.0",model_name="m",tier="device"} 0.0' in text
    assert 'fluidpd:kv_block_idle_before_evict_seconds_sum{model_name="m",tier="device"} 190.0' in text
    # without a store: no store metrics, the residency histograms of the arena still
    text = generate_latest(ServerMetrics(_Runtime({"workers": [], "kv_tiers": meter}), "m").registry).decode()
    assert "kv_store_usage_perc" not in text and "kv_block_reuse_gap_seconds_count" in text
