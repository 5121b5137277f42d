"""Prometheus metrics of the OpenAI server, in a `fluidpd:` namespace shaped like vLLM's.

Measured by the server itself, per request, at the HTTP layer:
    fluidpd:time_to_first_token_seconds   histogram: request accepted -> first token event
    fluidpd:inter_token_latency_seconds   histogram: every gap between token events
    fluidpd:e2e_request_latency_seconds   histogram: request accepted -> last event
    fluidpd:prompt_tokens_total, fluidpd:generation_tokens_total         counters
    fluidpd:request_success_total{finish_reason}                          counter
    fluidpd:request_rejected_overload_total   counter: requests refused with 429 by admission control
    fluidpd:request_slo_attained_total    counter: requests finished (stop, length) meeting the joint SLO
                                           (TTFT <= the runtime's TTFT SLO and mean TPOT <= its TBT SLO,
                                           DistServe's; the snapshot's `slo`): divide by request_success_total
Read from the runtime at scrape time (`runtime.metrics_snapshot()`; fluidpd.server.runtime_metrics):
    fluidpd:num_requests_running, fluidpd:num_requests_waiting            gauges
    fluidpd:kv_cache_usage_perc{worker}    gauge, fraction of the worker's KV blocks in use (0..1)
    fluidpd:prefill_pressure_index, fluidpd:decode_pressure_index         gauges
    fluidpd:worker_role{worker, role}      gauge: 1 for the worker's current role, 0 for the others
    fluidpd:role_transitions_total         counter
    fluidpd:worker_lost_total              counter: workers lost (died, or stopped answering)
    fluidpd:server_draining                gauge: 1 while the runtime drains (no new requests), else 0
    fluidpd:kv_transfer_bytes_total        counter: KV bytes hand-offs and migrations sent between workers
    fluidpd:prefix_cache_queries_total{worker}, fluidpd:prefix_cache_hits_total{worker}
                                           counters, in tokens: prompt tokens looked up in the worker's
                                           prefix cache at their first admission, and those it held
    fluidpd:prefix_cache_tier_hits_total{worker, tier}   the hits by tier: device (its arena), store
    fluidpd:kv_offload_bytes_total, _seconds_total, fluidpd:kv_load_bytes_total, _seconds_total
                                           KV blocks written to / read from the node's KV store
    fluidpd:kv_store_usage_perc, fluidpd:kv_store_blocks, fluidpd:kv_store_evicted_blocks_total,
    fluidpd:kv_store_checksum_failures_total   the store's occupancy, evictions, blocks refused on load
    fluidpd:kv_block_reuse_gap_seconds{tier}, fluidpd:kv_block_idle_before_evict_seconds{tier}
                                           histograms: how long a cached block sat before a hit, and
                                           before it was evicted unused (vLLM's residency metrics)
  Per worker ({worker}; fluidpd.server.worker_metrics):
    fluidpd:worker_num_requests_running, fluidpd:worker_num_requests_waiting   gauges
    fluidpd:worker_step_time_seconds       gauge: EWMA of the worker's decode step time
    fluidpd:worker_generation_tokens_total counter: tokens the worker generated
    fluidpd:fluidtoken_borrowed_chunks_total   counter: prefill chunks the worker ran as a decode worker
    fluidpd:kv_cached_blocks               gauge: blocks its prefix cache holds
    fluidpd:worker_in_transition           gauge: 1 while it switches roles

The snapshot contract (every key optional; a missing one is not exported):
    {"num_requests_running": int, "num_requests_waiting": int,
     "prefill_pressure_index": float, "decode_pressure_index": float,
     "role_transitions_total": int, "kv_transfer_bytes_total": float, "worker_lost_total": int,
     "draining": bool, "slo": {"ttft_s": float, "tbt_s": float},
     "workers": [{"id": int, "role": "prefill" | "decode" | "colocated" | ..., "kv_cache_usage_perc": float,
                  "prefix_cache_queries": int, "prefix_cache_hits": int, "prefix_cache_store_hits": int,
                  "num_requests_running": int, "num_requests_waiting": int, "step_time_s": float,
                  "generation_tokens": int, "fluidtoken_borrowed_chunks": int, "kv_cached_blocks": int,
                  "in_transition": bool}],
     "kv_tiers": fluidpd.runtime.kv_tiers.KVTierMeter, "kv_store": {...}}
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from fluidpd.server.runtime_metrics import RuntimeCollector

log = logging.getLogger("fluidpd.server.metrics")

NS = "fluidpd:"
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class ServerMetrics:
    """All metric objects of one app, in their own registry (several apps may live in one process)."""

    def __init__(self, runtime, model_name: str) -> None:
        self.model_name = model_name
        self.registry = reg = CollectorRegistry()
        labels = ["model_name"]
        self.ttft = Histogram(
            NS + "time_to_first_token_seconds",
            "Time to first token (server side).",
            labels,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self.itl = Histogram(
            NS + "inter_token_latency_seconds",
            "Gap between streamed tokens (server side).",
            labels,
            buckets=ITL_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self.e2e = Histogram(
            NS + "e2e_request_latency_seconds",
            "Request latency, accepted to last token.",
            labels,
            buckets=E2E_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self.prompt_tokens = Counter(
            NS + "prompt_tokens", "Prompt tokens of accepted requests.", labels, registry=reg
        ).labels(model_name)
        self.generation_tokens = Counter(NS + "generation_tokens", "Generated tokens.", labels, registry=reg).labels(
            model_name
        )
        self._success = Counter(
            NS + "request_success", "Finished requests by finish reason.", ["model_name", "finish_reason"], registry=reg
        )
        self._overload = Counter(
            NS + "request_rejected_overload", "Requests refused with 429 by admission control.", labels, registry=reg
        ).labels(model_name)
        self._slo_attained = Counter(
            NS + "request_slo_attained",
            "Finished requests meeting the joint SLO (TTFT and mean TPOT).",
            labels,
            registry=reg,
        ).labels(model_name)
        self.runtime = runtime
        self._slo: dict | None = None  # the runtime's SLOs, read from its snapshot at the first finish
        reg.register(RuntimeCollector(runtime, model_name))

    def request(self, accepted_s: float, prompt_tokens: int, n: int = 1) -> RequestTimer:
        self.prompt_tokens.inc(prompt_tokens)
        return RequestTimer(self, accepted_s, n)

    def rejected_overload(self) -> None:
        self._overload.inc()

    def finished(self, reason: str) -> None:
        self._success.labels(self.model_name, reason).inc()

    def slo(self) -> dict:
        """The runtime's {"ttft_s", "tbt_s"} ({}: it reports none, so no request attains it)."""
        if self._slo is None:
            try:
                self._slo = dict((self.runtime.metrics_snapshot() or {}).get("slo") or {})
            except Exception:  # noqa: BLE001 - a runtime not started yet: ask again at the next finish
                log.exception("metrics_snapshot failed")
                return {}
        return self._slo

    def attained(self, ttft_s: float, tpot_s: float) -> None:
        """Count a finished request that met the joint SLO (DistServe's: TTFT and mean TPOT)."""
        slo = self.slo()
        if slo and ttft_s <= slo["ttft_s"] and tpot_s <= slo["tbt_s"]:
            self._slo_attained.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """One request's latencies as the HTTP layer sees them (perf_counter seconds); with n > 1 sequences, the
    gaps between tokens are each sequence's own and TPOT is a sequence's mean."""

    def __init__(self, metrics: ServerMetrics, accepted_s: float, n: int = 1) -> None:
        self.m, self.accepted_s, self.n = metrics, accepted_s, n
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.last_by: dict[int, float] = {}  # sequence index -> when its last token arrived
        self.tokens = 0
        self.done = False

    def on_tokens(self, n: int, now: float, index: int = 0) -> None:
        """`n` tokens of sequence `index` arrived together at `now`: one gap (the rest came with it)."""
        if n <= 0:
            return
        if self.first_s is None:
            self.first_s = now
            self.m.ttft.observe(now - self.accepted_s)
        elif index in self.last_by:
            self.m.itl.observe(now - self.last_by[index])
        for _ in range(n - 1):
            self.m.itl.observe(0.0)
        self.last_s = self.last_by[index] = now
        self.tokens += n
        self.m.generation_tokens.inc(n)

    def finish(self, reason: str, now: float) -> None:
        if self.done:
            return
        self.done = True
        self.m.e2e.observe(now - self.accepted_s)
        self.m.finished(reason)
        if reason in ("stop", "length") and self.first_s is not None and self.last_s is not None:
            per_seq = self.tokens / self.n
            tpot = (self.last_s - self.first_s) / (per_seq - 1) if per_seq > 1 else 0.0
            self.m.attained(self.first_s - self.accepted_s, tpot)
