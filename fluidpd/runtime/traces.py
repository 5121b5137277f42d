"""The runtime's request timelines: the last N for /v1/admin/traces, and each one to OpenTelemetry
when an OTLP endpoint is set (`fluidpd.runtime.otel`)."""

from __future__ import annotations

import time
from collections import deque

from fluidpd.world.trace import RequestTrace


class TraceStore:
    """The last `keep` finished requests' timelines; each one also goes to `export` (e.g. OTLP spans)."""

    def __init__(self, keep: int, export=None) -> None:
        self.kept: deque[RequestTrace] = deque(maxlen=max(keep, 1))
        self.keep = keep
        self.export = export  # fluidpd.runtime.otel.SpanExport, or None
        self.unix_t0 = time.time()  # the wall-clock time of the runtime's second 0

    def start(self, now: float) -> None:
        """The runtime's clock reads `now` at this instant."""
        self.unix_t0 = time.time() - now

    def add(self, trace: RequestTrace) -> None:
        if self.keep:
            self.kept.append(trace)
        if self.export is not None:
            self.export.export(trace, self.unix_t0)

    def recent(self, limit: int) -> list[dict]:
        """The last `limit` timelines, newest first."""
        return [t.to_json() for t in list(self.kept)[::-1][:limit]] if self.keep else []

    def find(self, name: str) -> dict | None:
        return next((t.to_json() for t in reversed(self.kept) if t.name == name), None) if self.keep else None

    def close(self) -> None:
        if self.export is not None:
            self.export.close()
