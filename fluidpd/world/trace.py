"""Per-request timelines, recorded by the World's lifecycle the same way in both worlds.

    arrival -> queued (on a worker) -> admitted (its cache hit) -> prefill_chunk ... -> first_token
      -> [kv_transfer (hand-off) ->] decode -> finish
with preempted / restarted / role_switch / kv_transfer (migration) wherever they happen. Times are the
world's clock (seconds); a span has an `end_s`. `decode` spans are derived when the request ends:
its KV's worker from the first token (or the KV's arrival) to the next move, preemption or the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SPAN_KINDS = ("queued", "prefill_chunk", "kv_transfer", "decode")


@dataclass(slots=True)
class TraceEvent:
    """One moment (or, with `end_s`, one span) of a request's life, on `worker`."""

    kind: str
    t_s: float
    worker: int = -1
    end_s: float | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind, "t_s": self.t_s, "worker": self.worker}
        if self.end_s is not None:
            out["end_s"] = self.end_s
        return out | self.attrs


@dataclass(slots=True)
class RequestTrace:
    """A request's timeline: what happened to it, where and when, and how it ended."""

    request_id: int
    name: str  # the id its client knows (the runtime's response id; the simulator's request id)
    arrival_s: float
    prompt_tokens: int
    events: list[TraceEvent] = field(default_factory=list)
    finish_s: float | None = None
    finish_reason: str = ""
    output_tokens: int = 0
    cached_tokens: int = 0
    first_token_s: float | None = None
    error: str = ""

    @property
    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def to_json(self) -> dict:
        return {
            "id": self.name,
            "request_id": self.request_id,
            "arrival_s": self.arrival_s,
            "first_token_s": self.first_token_s,
            "finish_s": self.finish_s,
            "finish_reason": self.finish_reason,
            "error": self.error or None,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "events": [e.to_json() for e in self.events],
        }


class RequestTracer:
    """Keeps the timeline of every request in flight; hands each finished one to `sink`."""

    def __init__(self, sink: Callable[[RequestTrace], None]) -> None:
        self.sink = sink
        self.open: dict[int, RequestTrace] = {}
        self._step_start: dict[int, float] = {}  # worker -> when its step in flight started
        self._moves: dict[int, TraceEvent] = {}  # request -> its KV transfer in flight

    def begin(self, req, name: str = "") -> RequestTrace:
        trace = self.open.get(req.id)
        if trace is None:
            trace = self.open[req.id] = RequestTrace(req.id, name or str(req.id), req.arrival_s, req.prompt_len)
            trace.events.append(TraceEvent("arrival", req.arrival_s))
        return trace

    def mark(self, req, kind: str, now: float, worker: int = -1, **attrs) -> None:
        self.begin(req).events.append(TraceEvent(kind, now, worker, attrs=attrs))

    def queued(self, req, w, now: float) -> None:
        events = self.begin(req).events
        events.append(TraceEvent("queued", now, w.id, attrs={"role": w.role.value}))

    def admitted(self, req, w, now: float, hit: int, loaded_blocks: int) -> None:
        """`req` (or a piece of its prompt) starts prefilling on `w`, `hit` tokens of it cached there."""
        trace = self.open.get(req.id)
        if trace is None:
            return
        for e in reversed(trace.events):  # the wait in the queue ends
            if e.kind == "queued" and e.end_s is None:
                e.end_s = now
                break
        attrs = {"cached_tokens": hit, "loaded_tokens": loaded_blocks * w.block_size}
        if hasattr(req, "offset"):  # a piece of a prompt spread over workers (FluidToken)
            attrs["piece_offset"] = req.offset
        trace.events.append(TraceEvent("admitted", now, w.id, attrs=attrs))

    def step_started(self, w, now: float) -> None:
        self._step_start[w.id] = now

    def chunks_done(self, w, chunks, now: float) -> None:
        start = self._step_start.get(w.id, now)
        for req, c in chunks:
            rid = req.id  # a prompt piece's chunk is its request's
            trace = self.open.get(rid)
            if trace is not None:
                attrs = {"tokens": c, "role": w.role.value, "borrowed": w.role.value == "decode"}
                trace.events.append(TraceEvent("prefill_chunk", start, w.id, now, attrs))

    def transfer_started(self, req, src, dst, tokens: int, nbytes: float, cls: str, now: float) -> None:
        trace = self.open.get(req.id)
        if trace is None:
            return
        attrs = {"to": dst.id, "tokens": tokens, "bytes": int(nbytes), "class": cls}
        self._moves[req.id] = e = TraceEvent("kv_transfer", now, src.id, None, attrs)
        trace.events.append(e)

    def transfer_done(self, req, now: float) -> None:
        e = self._moves.pop(req.id, None)
        if e is not None:
            e.end_s = now

    def role_switch(self, reqs, w, t, now: float) -> None:
        """A role transition `t` (FluidRole) reached `w` while `reqs` were on it."""
        for req in reqs:
            trace = self.open.get(req.id)
            if trace is None or any(e.kind == "role_switch" and e.attrs["epoch"] == t.epoch for e in trace.events):
                continue
            attrs = {"from": t.src_role.value, "to": t.dst_role.value, "phase": t.phase, "epoch": t.epoch}
            trace.events.append(TraceEvent("role_switch", now, w.id, attrs=attrs))

    def finish(self, req, now: float, reason: str, error: str = "") -> RequestTrace | None:
        trace = self.open.pop(req.id, None)
        self._moves.pop(req.id, None)
        if trace is None:
            return None
        trace.finish_s, trace.finish_reason, trace.error = now, reason, error
        trace.output_tokens, trace.cached_tokens = req.generated, req.cached_tokens
        if req.generated:
            trace.first_token_s = req.first_token_s
            trace.events.append(TraceEvent("first_token", req.first_token_s))
        for e in trace.events:
            if e.kind == "queued" and e.end_s is None:
                e.end_s = now
        trace.events.extend(decode_spans(trace.events, now))
        trace.events.append(TraceEvent("finish", now, attrs={"reason": reason}))
        trace.events.sort(key=lambda e: e.t_s)
        self.sink(trace)
        return trace


def decode_spans(events: list[TraceEvent], end: float) -> list[TraceEvent]:
    """Where the request decoded: on the worker of its last prefill chunk from the chunk's end (its
    first token at the earliest), or where a move put its KV from the move's end, until its next move,
    preemption, restart or `end`. A hand-off's wait on the prefill worker is not decoding."""
    first = next((e.t_s for e in events if e.kind == "first_token"), None)
    spans: list[TraceEvent] = []
    if first is None:
        return spans
    at, since = -1, first
    for e in sorted(events, key=lambda e: e.t_s):
        if e.kind == "prefill_chunk":
            at, since = e.worker, max(first, e.end_s if e.end_s is not None else e.t_s)
        elif e.kind == "kv_transfer":
            if e.attrs["class"] != "handoff":
                _close(spans, at, since, e.t_s)
            at, since = e.attrs["to"], max(first, e.end_s if e.end_s is not None else e.t_s)
        elif e.kind in ("preempted", "restarted"):
            _close(spans, at, since, e.t_s)
            at = -1
    _close(spans, at, since, end)
    return spans


def _close(spans: list[TraceEvent], worker: int, start: float, end: float) -> None:
    if worker >= 0 and end > start:
        spans.append(TraceEvent("decode", start, worker, end))
