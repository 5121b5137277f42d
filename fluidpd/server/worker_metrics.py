"""The per-worker families of /metrics read from the runtime snapshot's `workers` (fluidpd.server.metrics
lists them): what each worker runs and queues, its step time, its tokens, its FluidToken borrowing, its
cached KV blocks and whether it is switching roles. A family is exported where some worker reports it."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

NS = "fluidpd:"
LABELS = ["model_name", "worker"]

GAUGES = (  # (snapshot key, metric name, help)
    ("num_requests_running", "worker_num_requests_running", "Requests the worker runs (prefilling or decoding)."),
    (
        "num_requests_waiting",
        "worker_num_requests_waiting",
        "Requests queued at the worker, or waiting for their KV to arrive there.",
    ),
    ("step_time_s", "worker_step_time_seconds", "EWMA of the worker's decode step time, seconds."),
    ("kv_cached_blocks", "kv_cached_blocks", "KV blocks the worker's prefix cache holds (in use or evictable)."),
    ("in_transition", "worker_in_transition", "1 while the worker switches roles (FluidRole), else 0."),
)
COUNTERS = (
    ("generation_tokens", "worker_generation_tokens", "Tokens the worker generated."),
    (
        "fluidtoken_borrowed_chunks",
        "fluidtoken_borrowed_chunks",
        "Prefill chunks the worker ran while a decode worker (FluidToken).",
    ),
)


def worker_families(model: str, workers: list[dict]):
    """The gauges and counters above, one sample per worker that reports the key."""
    for kind, table in ((GaugeMetricFamily, GAUGES), (CounterMetricFamily, COUNTERS)):
        for key, name, doc in table:
            rows = [(str(w.get("id")), w[key]) for w in workers if w.get(key) is not None]
            if not rows:
                continue
            family = kind(NS + name, doc, labels=LABELS)
            for wid, value in rows:
                family.add_metric([model, wid], float(value))
            yield family
