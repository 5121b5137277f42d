"""Request timelines as OpenTelemetry spans: one `fluidpd.request` span per request with a child span
per phase (queued, prefill_chunk, kv_transfer, decode) and its moments as span events, sent to an
OTLP/HTTP endpoint (`--otlp-traces-endpoint`, as vLLM's) or to any span processor (a test's)."""

from __future__ import annotations

from fluidpd.world.trace import SPAN_KINDS, RequestTrace

OTEL_EXTRA = "pip install 'fluidpd[otel]'"


class SpanExport:
    """Turns finished RequestTraces into spans of `provider` (an opentelemetry-sdk TracerProvider)."""

    def __init__(self, provider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("fluidpd")

    @classmethod
    def otlp(cls, endpoint: str) -> SpanExport:
        """Spans batched to an OTLP/HTTP collector at `endpoint` (e.g. http://127.0.0.1:4318/v1/traces)."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ValueError(f"--otlp-traces-endpoint needs OpenTelemetry ({OTEL_EXTRA}): {exc}") from None
        provider = tracer_provider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        return cls(provider)

    def export(self, trace: RequestTrace, unix_t0: float) -> None:
        def ns(t: float) -> int:
            return int((unix_t0 + t) * 1e9)

        end = trace.finish_s if trace.finish_s is not None else trace.arrival_s
        root = self.tracer.start_span("fluidpd.request", start_time=ns(trace.arrival_s), attributes=_root_attrs(trace))
        from opentelemetry import trace as otel_trace

        ctx = otel_trace.set_span_in_context(root)
        for e in trace.events:
            attrs = {"fluidpd.worker": e.worker, **{f"fluidpd.{k}": v for k, v in e.attrs.items() if v is not None}}
            if e.kind in SPAN_KINDS:
                span = self.tracer.start_span(f"fluidpd.{e.kind}", context=ctx, start_time=ns(e.t_s), attributes=attrs)
                span.end(end_time=ns(e.end_s if e.end_s is not None else e.t_s))
            else:
                root.add_event(e.kind, attributes=attrs, timestamp=ns(e.t_s))
        if trace.error:
            from opentelemetry.trace import Status, StatusCode

            root.set_status(Status(StatusCode.ERROR, trace.error))
        root.end(end_time=ns(end))

    def close(self) -> None:
        self.provider.shutdown()  # flushes what is batched


def tracer_provider():
    """An SDK TracerProvider whose resource names this service `fluidpd`."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as exc:
        raise ValueError(f"request traces over OpenTelemetry need its SDK ({OTEL_EXTRA}): {exc}") from None
    return TracerProvider(resource=Resource.create({"service.name": "fluidpd"}))


def _root_attrs(trace: RequestTrace) -> dict:
    """vLLM's gen_ai.* request attributes, and FluidPD's own."""
    attrs = {
        "gen_ai.request.id": trace.name,
        "gen_ai.usage.prompt_tokens": trace.prompt_tokens,
        "gen_ai.usage.completion_tokens": trace.output_tokens,
        "gen_ai.response.finish_reasons": [trace.finish_reason],
        "fluidpd.cached_tokens": trace.cached_tokens,
    }
    admitted = next((e.t_s for e in trace.events if e.kind == "admitted"), None)
    if admitted is not None:
        attrs["gen_ai.latency.time_in_queue"] = admitted - trace.arrival_s
    if trace.first_token_s is not None:
        attrs["gen_ai.latency.time_to_first_token"] = trace.first_token_s - trace.arrival_s
    if trace.finish_s is not None:
        attrs["gen_ai.latency.e2e"] = trace.finish_s - trace.arrival_s
    return attrs
