"""The families of /metrics read from the runtime's snapshot at scrape time (fluidpd.server.metrics lists them)."""

from __future__ import annotations

import logging

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from fluidpd.server.worker_metrics import NS, worker_families

log = logging.getLogger("fluidpd.server.metrics")

ROLES = ("prefill", "decode", "colocated")


class RuntimeCollector:
    """Gauges (and the role-transition counter) read from the runtime at scrape time."""

    def __init__(self, runtime, model_name: str) -> None:
        self.runtime, self.model = runtime, model_name

    def describe(self):
        return []  # no scrape at registration time

    def collect(self):
        try:
            snap = self.runtime.metrics_snapshot() or {}
        except Exception:  # noqa: BLE001 - a scrape must not fail because the runtime did
            log.exception("metrics_snapshot failed")
            snap = {}
        m = self.model
        for key, doc in (
            ("num_requests_running", "Requests holding KV and being computed."),
            ("num_requests_waiting", "Requests queued, not yet running."),
            ("prefill_pressure_index", "FluidPD prefill pressure index (PPI)."),
            ("decode_pressure_index", "FluidPD decode pressure index (DPI)."),
        ):
            if key in snap and snap[key] is not None:
                g = GaugeMetricFamily(NS + key, doc, labels=["model_name"])
                g.add_metric([m], float(snap[key]))
                yield g
        workers = list(snap.get("workers") or [])
        kv = GaugeMetricFamily(
            NS + "kv_cache_usage_perc",
            "Fraction of the worker's KV blocks in use (0..1).",
            labels=["model_name", "worker"],
        )
        role = GaugeMetricFamily(
            NS + "worker_role",
            "1 for the worker's current role, 0 for the others.",
            labels=["model_name", "worker", "role"],
        )
        for w in workers:
            wid = str(w.get("id"))
            if w.get("kv_cache_usage_perc") is not None:
                kv.add_metric([m, wid], float(w["kv_cache_usage_perc"]))
            current = w.get("role")
            current = str(getattr(current, "value", current) or "")
            for r in ROLES + ((current,) if current and current not in ROLES else ()):
                role.add_metric([m, wid, r], 1.0 if r == current else 0.0)
        if workers:
            yield kv
            yield role
        yield from worker_families(m, workers)
        yield from _prefix_counters(m, workers)
        yield from _tier_hits(m, workers)
        yield from _kv_tier_metrics(m, snap.get("kv_tiers"), "kv_store" in snap)
        yield from _cluster_counters(m, snap)
        if snap.get("draining") is not None:
            g = GaugeMetricFamily(NS + "server_draining", "1 while the runtime drains, else 0.", labels=["model_name"])
            g.add_metric([m], 1.0 if snap["draining"] else 0.0)
            yield g


def _cluster_counters(model: str, snap: dict):
    """The cluster's counters of KV moved, role switches and workers lost, where reported."""
    for key, doc in (
        ("kv_transfer_bytes_total", "KV bytes sent between workers (hand-offs and migrations)."),
        ("role_transitions_total", "Completed worker role transitions."),
        ("worker_lost_total", "Workers lost (died or stopped answering)."),
    ):
        if snap.get(key) is not None:
            c = CounterMetricFamily(NS + key.removesuffix("_total"), doc, labels=["model_name"])
            c.add_metric([model], float(snap[key]))
            yield c


def _prefix_counters(model: str, workers: list[dict]):
    """fluidpd:prefix_cache_queries_total / _hits_total per worker (vLLM's names), where reported."""
    for key, doc in (
        ("prefix_cache_queries", "Prompt tokens looked up in the worker's prefix cache (first admissions)."),
        ("prefix_cache_hits", "Prompt tokens whose prefill the worker's prefix cache skipped."),
    ):
        c = CounterMetricFamily(NS + key, doc, labels=["model_name", "worker"])
        rows = [(str(w.get("id")), w[key]) for w in workers if w.get(key) is not None]
        for wid, v in rows:
            c.add_metric([model, wid], float(v))
        if rows:
            yield c


def _tier_hits(model: str, workers: list[dict]):
    c = CounterMetricFamily(
        NS + "prefix_cache_tier_hits",
        "Prompt tokens whose prefill a cache tier skipped: device (the worker's arena) or store (the node's).",
        labels=["model_name", "worker", "tier"],
    )
    rows = [w for w in workers if w.get("prefix_cache_hits") is not None]
    for w in rows:
        store = w.get("prefix_cache_store_hits") or 0
        c.add_metric([model, str(w.get("id")), "device"], float(w["prefix_cache_hits"] - store))
        c.add_metric([model, str(w.get("id")), "store"], float(store))
    if rows:
        yield c


def _kv_tier_metrics(model: str, meter, has_store: bool):
    """The KV store's traffic and occupancy (with a store), and the block residency histograms by tier."""
    if meter is None:
        return
    t = meter.traffic
    if has_store:
        for name, value, doc in (
            ("kv_offload_bytes", t.offloaded_bytes, "KV bytes written to the node's KV store."),
            ("kv_offload_seconds", t.offload_s, "Seconds the workers spent writing to the KV store."),
            ("kv_load_bytes", t.loaded_bytes, "KV bytes loaded from the node's KV store into arenas."),
            ("kv_load_seconds", t.load_s, "Seconds the workers spent loading from the KV store."),
            ("kv_store_evicted_blocks", t.evicted_blocks, "Blocks the KV store evicted for room."),
            ("kv_store_checksum_failures", t.checksum_failures, "Store blocks failing their check."),
        ):
            c = CounterMetricFamily(NS + name, doc, labels=["model_name"])
            c.add_metric([model], float(value))
            yield c
        cap = t.store_capacity_blocks
        for name, value, doc in (
            ("kv_store_blocks", t.store_used_blocks, "KV blocks the node's store holds."),
            ("kv_store_usage_perc", t.store_used_blocks / cap if cap else 0.0, "Fraction of the KV store used."),
        ):
            g = GaugeMetricFamily(NS + name, doc, labels=["model_name"])
            g.add_metric([model], float(value))
            yield g
    for name, hists, doc in (
        ("kv_block_reuse_gap_seconds", meter.reuse_gap, "Seconds a cached KV block sat unused before a hit."),
        (
            "kv_block_idle_before_evict_seconds",
            meter.idle_before_evict,
            "Seconds a cached block sat unused till evicted.",
        ),
    ):
        h = HistogramMetricFamily(NS + name, doc, labels=["model_name", "tier"])
        for tier, b in sorted(hists.items()):
            h.add_metric([model, tier], b.cumulative(), b.sum)
        if hists:
            yield h
