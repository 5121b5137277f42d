"""Reading the served runtime from a test: a Prometheus value, the runtime at rest."""

from __future__ import annotations

import time


def metric(text: str, name: str, labels: str = "") -> float:
    """The sum of `name`'s samples in a /metrics page (those whose labels contain `labels`)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if labels and labels not in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
    return total


def idle(runtime, timeout_s: float = 300.0) -> dict:
    """The runtime's metrics once nothing runs or waits (or after `timeout_s`, for the assert to show)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = runtime.metrics_snapshot()
        if (snap["num_requests_running"], snap["num_requests_waiting"]) == (0, 0) or time.monotonic() > deadline:
            return snap
        time.sleep(0.05)


def healthy(url: str) -> bool:
    """Whether the server at `url` answers /health with 200 (False while it is not listening yet)."""
    import httpx

    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
