"""LocalRuntime: one LLMEngine on one background thread, served through the ServingRuntime protocol.

This is `fluidpd serve --workers 1`: a single colocated worker driven by the engine's built-in
continuous-batching scheduler (`engine.step()`). The event loop never touches the engine:
`submit` validates against the engine's constants and queues the request; the engine thread
applies queued adds and aborts between steps and hands every step's TokenEvents back to the
loop with one `loop.call_soon_threadsafe` call. Every accepted request ends with exactly one
event carrying a finish_reason: "stop" | "length" | "abort" | "error".
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import traceback
from collections import deque
from typing import AsyncIterator

from fluidpd.runtime.api import GenerationRequest, TokenEvent

log = logging.getLogger("fluidpd.runtime.local")

# the engine's own words -> OpenAI's; "capacity": the request outgrew the whole KV pool
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "capacity": "length"}
EWMA = 0.2


class LocalStream:
    """Async iterator of one request's TokenEvents (fed from the engine thread)."""

    def __init__(self, runtime: "LocalRuntime", request_id: str) -> None:
        self.request_id = request_id
        self._runtime = runtime
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.finished = False

    def _put(self, event: TokenEvent) -> None:   # on the event loop
        if not self.finished:
            self.finished = event.finish_reason is not None
            self._queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[TokenEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if event.finish_reason is not None:
                return

    async def abort(self) -> None:
        if not self.finished:
            self._runtime._request_abort(self.request_id)


class LocalRuntime:
    """A ServingRuntime over one in-process LLMEngine (a single colocated worker)."""

    policy_name = "colocated"

    def __init__(self, config=None, *, engine=None, model_name: str | None = None,
                 ttft_slo: float | None = None, tbt_slo: float | None = None) -> None:
        if engine is None:
            from fluidpd.engine import EngineConfig, LLMEngine

            engine = LLMEngine(config or EngineConfig())
        if engine.tokenizer is None:
            raise ValueError("serving needs a tokenizer: set EngineConfig.tokenizer for this model")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_path = engine.config.model
        self.model_name = model_name or served_model_name(engine.config.model)
        base = os.path.basename(os.path.normpath(self.model_path))
        aliases = {self.model_path, base, base[:-5] if base.endswith(".gguf") else base}
        self.model_aliases = tuple(sorted(aliases - {self.model_name}))   # also accepted as `model`
        pool_tokens = engine.blocks.num_blocks * engine.config.block_size
        # longer requests could never hold their KV in this pool
        self.max_model_len = min(engine.max_model_len, pool_tokens)
        self.vocab_size = engine.model_config.vocab_size
        self.ttft_slo, self.tbt_slo = ttft_slo, tbt_slo

        self._cond = threading.Condition()
        self._adds: deque[tuple[GenerationRequest, LocalStream]] = deque()
        self._aborts: set[str] = set()
        self._streams: dict[str, LocalStream] = {}     # accepted and not yet finished
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.healthy = True
        self.last_error: str | None = None
        # telemetry, written by the engine thread
        self._step_ewma_s = 0.0
        self._decode_step_ewma_s = 0.0
        self._prefill_tok_s = 0.0
        self._steps = 0
        self._snap = self._snapshot()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="fluidpd-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        await asyncio.to_thread(thread.join)
        self._thread = None
        for rid in list(self.engine.seqs):   # the thread is gone: the engine is ours now
            self.engine.abort(rid)
        self._snap = self._snapshot()
        # whatever is still in flight ends visibly
        for rid in list(self._streams):
            self._finish_stream(rid, TokenEvent([], "abort", error="server shutting down"))
        with self._cond:
            self._adds.clear()
            self._aborts.clear()

    # ------------------------------------------------------------------ requests
    def submit(self, request: GenerationRequest) -> LocalStream:
        from fluidpd.engine import SamplingParams

        if self._thread is None or self._loop is None:
            raise RuntimeError("LocalRuntime is not started (await runtime.start() first)")
        ids = [int(t) for t in request.prompt_token_ids]
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) > self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, longer than max_model_len {self.max_model_len}")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} out of range for vocab size {self.vocab_size}")
        if not isinstance(request.params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(request.params).__name__}")
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        request.prompt_token_ids = ids
        request.arrival_s = time.perf_counter()
        stream = LocalStream(self, request.request_id)
        self._streams[request.request_id] = stream
        with self._cond:
            self._adds.append((request, stream))
            self._cond.notify_all()
        return stream

    def _request_abort(self, request_id: str) -> None:
        with self._cond:
            self._aborts.add(request_id)
            self._cond.notify_all()

    # ------------------------------------------------------------------ state
    def cluster_state(self) -> dict:
        s = self._snap
        worker = {
            "id": 0, "role": "colocated", "routable": True, "state": "serving",
            "queue": s["waiting"], "running": s["running"], "decoding": s["decoding"],
            "kv_blocks_used": s["kv_used"], "kv_blocks_total": s["kv_total"],
            "kv_use": s["kv_used"] / max(s["kv_total"], 1),
            "step_time_ewma_s": self._step_ewma_s, "decode_step_time_ewma_s": self._decode_step_ewma_s,
            "steps": self._steps,
        }
        return {
            "policy": self.policy_name, "state": "steady" if self.healthy else "failed",
            "model": self.model_name, "max_model_len": self.max_model_len,
            "ppi": self._ppi(s), "dpi": self._dpi(s),
            "slo": {"ttft_s": self.ttft_slo, "tbt_s": self.tbt_slo},
            "workers": [worker], "transitions": [], "last_error": self.last_error,
        }

    def force_role(self, worker_id: int, role: str) -> dict:
        raise ValueError("a single colocated worker cannot switch roles")

    def metrics_snapshot(self) -> dict:
        s = self._snap
        return {
            "num_requests_running": s["running"],
            "num_requests_waiting": s["waiting"],
            "prefill_pressure_index": self._ppi(s),
            "decode_pressure_index": self._dpi(s),
            "role_transitions_total": 0,
            "workers": [{"id": 0, "role": "colocated", "kv_cache_usage_perc": s["kv_used"] / max(s["kv_total"], 1),
                         "num_running": s["running"], "num_waiting": s["waiting"]}],
        }

    def _ppi(self, s: dict) -> float:
        """Queued prompt work over one TTFT horizon (the seed's PPI for one colocated worker)."""
        if not self.ttft_slo or not s["queued_prefill_tokens"]:
            return 0.0
        rate = self._prefill_tok_s or 1000.0
        return s["queued_prefill_tokens"] / rate / self.ttft_slo

    def _dpi(self, s: dict) -> float:
        kv = s["kv_used"] / max(s["kv_total"], 1)
        if not self.tbt_slo:
            return kv
        t_iter = self._decode_step_ewma_s if s["decoding"] else 0.0   # an idle worker has no pressure
        return 0.5 * t_iter / self.tbt_slo + 0.5 * kv

    def _snapshot(self) -> dict:
        e = self.engine
        sched = e.scheduler
        queued = sum(s.num_uncomputed for s in list(sched.waiting))
        queued += sum(s.num_uncomputed for s in list(sched.running) if not s.is_decoding)
        return {"running": sched.num_running, "waiting": sched.num_waiting + len(self._adds),
                "decoding": sum(1 for s in list(sched.running) if s.is_decoding),
                "kv_used": e.blocks.num_used, "kv_total": e.blocks.num_blocks,
                "queued_prefill_tokens": queued}

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not (self._stopping or self._adds or self._aborts or engine.has_unfinished()):
                    self._snap = self._snapshot()
                    self._cond.wait()
                if self._stopping:
                    break
                adds, self._adds = list(self._adds), deque()
                aborts, self._aborts = self._aborts, set()
            events: list[tuple[str, TokenEvent]] = []
            for req, _stream in adds:
                if req.request_id in aborts:
                    events.append((req.request_id, TokenEvent([], "abort")))
                    continue
                try:
                    engine.add_request(req.prompt_token_ids, req.params, req.request_id)
                except Exception as exc:  # noqa: BLE001 - the engine's validation, reported per request
                    events.append((req.request_id, TokenEvent([], "error", error=f"rejected by the engine: {exc}")))
            for rid in aborts:
                if engine.abort(rid):
                    events.append((rid, TokenEvent([], "abort")))
            if engine.has_unfinished():
                try:
                    t0 = time.perf_counter()
                    outputs = engine.step()
                    self._observe_step(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001 - fail everything in flight, visibly
                    events += self._fail_all(exc)
                    outputs = []
                for o in outputs:
                    if o.new_token_ids or o.finished:
                        reason = FINISH_REASONS.get(o.finish_reason, "stop") if o.finished else None
                        events.append((o.request_id, TokenEvent(list(o.new_token_ids), reason, o.logprobs)))
                if not outputs and not events:
                    with self._cond:   # nothing could run (should not happen): do not spin
                        self._cond.wait(0.01)
            self._snap = self._snapshot()
            if events:
                self._deliver(events)

    def _observe_step(self, dt: float) -> None:
        self._steps += 1
        self._step_ewma_s += EWMA * (dt - self._step_ewma_s)
        last = self.engine.last_step
        if last is None:
            return
        if last.num_prefill_tokens:
            rate = last.num_prefill_tokens / max(last.step_s, 1e-9)
            self._prefill_tok_s = rate if not self._prefill_tok_s else self._prefill_tok_s + EWMA * (
                rate - self._prefill_tok_s)
        elif last.num_decode_tokens:
            self._decode_step_ewma_s += EWMA * (last.step_s - self._decode_step_ewma_s)

    def _fail_all(self, exc: BaseException) -> list[tuple[str, TokenEvent]]:
        msg = f"engine step failed: {type(exc).__name__}: {exc}"
        log.error("%s\n%s", msg, traceback.format_exc())
        self.last_error = msg
        events = []
        for rid in list(self.engine.seqs):
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - the engine is broken; keep failing requests visibly
                self.healthy = False
                self.engine.seqs.pop(rid, None)
            events.append((rid, TokenEvent([], "error", error=msg)))
        return events

    def _deliver(self, events: list[tuple[str, TokenEvent]]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._dispatch, events)
        except RuntimeError:   # the loop closed meanwhile
            pass

    def _dispatch(self, events: list[tuple[str, TokenEvent]]) -> None:   # on the event loop
        for rid, event in events:
            stream = self._streams.get(rid)
            if stream is None:
                continue
            if event.finish_reason is not None:
                self._finish_stream(rid, event)
            else:
                stream._put(event)

    def _finish_stream(self, rid: str, event: TokenEvent) -> None:
        stream = self._streams.pop(rid, None)
        if stream is not None:
            stream._put(event)


SMOLLM2_NAME = "SmolLM2-135M-Instruct"   # the name the multi-worker runtime serves "smollm2" under


def served_model_name(model: str) -> str:
    """The name clients use: SmolLM2-135M-Instruct for 'smollm2', else the path's basename."""
    if model == "smollm2":
        return SMOLLM2_NAME
    return os.path.basename(os.path.normpath(model))
