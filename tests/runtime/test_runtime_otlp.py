"""`--otlp-traces-endpoint`: request timelines leave as OTLP/HTTP protobuf, one `fluidpd.request` span
per request with a child span per phase, to a collector that decodes them (no model needed: the
timelines come from a simulated cluster, the same RequestTrace the runtime exports)."""

from __future__ import annotations

import http.server
import threading

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.otel import SpanExport
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.trace import Trace
from fluidpd.world.trace import RequestTracer


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: list

    def do_POST(self):
        self.bodies.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_timelines_reach_an_otlp_collector_as_spans():
    traces: list = []
    setup = Setup(
        get_model("llama-3.1-8b", "bf16"),
        get_hardware("h100"),
        Slo(1.0, 0.05),
        SimConfig(n_workers=2),
        PolicyConfig(prefill_workers=1),
    )
    tr = Trace("two", [0.0, 0.2], [600, 80], [20, 4])
    simulate(tr, "static-pd", setup, before_run=lambda c: setattr(c, "tracer", RequestTracer(traces.append)))
    bodies: list = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("C", (_Collector,), {"bodies": bodies}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        export = SpanExport.otlp(f"http://127.0.0.1:{srv.server_address[1]}/v1/traces")
        for t in traces:
            export.export(t, unix_t0=1.7e9)
        export.close()  # flushes the batch
    finally:
        srv.shutdown()
    spans = []
    for path, body in bodies:
        assert path == "/v1/traces"
        msg = ExportTraceServiceRequest.FromString(body)
        for rs in msg.resource_spans:
            assert {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"] == "fluidpd"
            spans += [s for ss in rs.scope_spans for s in ss.spans]
    roots = {s.span_id: s for s in spans if s.name == "fluidpd.request"}
    assert len(roots) == 2
    for t in traces:
        (root,) = [
            r
            for r in roots.values()
            if any(a.key == "gen_ai.request.id" and a.value.string_value == t.name for a in r.attributes)
        ]
        assert root.start_time_unix_nano == int((1.7e9 + t.arrival_s) * 1e9)
        assert root.end_time_unix_nano == int((1.7e9 + t.finish_s) * 1e9)
        kids = sorted(s.name for s in spans if s.parent_span_id == root.span_id)
        assert kids == sorted(f"fluidpd.{e.kind}" for e in t.events if e.end_s is not None)
        assert "fluidpd.kv_transfer" in kids and "fluidpd.decode" in kids
        assert [e.name for e in root.events] == [e.kind for e in t.events if e.end_s is None]
