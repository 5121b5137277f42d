"""The real world: the shared World lifecycle whose steps run on engine workers, on the wall clock.

Every step the policy plans is sent to the worker's engine as an explicit plan (prefill chunks,
decode ids); the engine's tokens stream to the requests, and the measured step time goes back to
the policy. KV moves by export on one engine and import on another (through the transport the
worker backends use). FluidRole's remap is a real `resize_kv` of the worker's arena.

Worker loss and replacement are `WorkerRecovery` (recovery.py); KV moves and phases `KVMoves` (kv_moves.py).
"""

from __future__ import annotations

import logging
import time

from fluidpd.core.metrics import MetricsCollector
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.base import Policy
from fluidpd.policy.view import StepPlan
from fluidpd.runtime import groups
from fluidpd.runtime.api import TokenEvent
from fluidpd.runtime.kv_moves import KVMoves
from fluidpd.runtime.kv_tiers import KVTierMeter
from fluidpd.runtime.live import Live, extend_hashes, first_event_extras, rescoring
from fluidpd.runtime.messages import WorkerError
from fluidpd.runtime.recovery import WorkerRecovery
from fluidpd.runtime.steplog import StepLog, StepRecord
from fluidpd.runtime.window import RecentWindow
from fluidpd.world.lifecycle import World
from fluidpd.world.worker import WorkerState

log = logging.getLogger("fluidpd.runtime")


class RuntimeCluster(WorkerRecovery, KVMoves, World):
    """A World whose workers are engine backends (in-process threads or processes)."""

    def __init__(
        self,
        backends: list,
        policy: Policy,
        kv_bytes_per_token: float,
        kv_blocks: int,
        metrics: MetricsCollector,
        block_size: int,
        loop,
        prefill_kv_fraction: float = 1.0,
        spawn=None,
        heartbeat_timeout_s: float = 1.0,
        step_timeout_s: float = 60.0,
        step_log: StepLog | None = None,
    ):
        super().__init__(policy, kv_bytes_per_token, kv_blocks, metrics, len(backends), block_size, lambda i: 0, loop)
        self.backends = backends
        self.prefill_kv_fraction = prefill_kv_fraction
        self.live: dict[int, Live] = {}
        self.failed: str | None = None
        self.running = True
        self.spawn = spawn  # wid -> an unstarted backend like the lost one (None: no replacements)
        self.heartbeat_timeout_s, self.step_timeout_s = heartbeat_timeout_s, step_timeout_s
        self.pings: dict[int, tuple] = {}  # worker -> (when its heartbeat in flight was sent, its future)
        self.step_started: dict[int, float] = {}
        self.running_kinds: dict[int, str] = {}  # worker -> the kind of its step in flight
        self.step_prefills: dict[int, list[int]] = {}  # worker -> the requests its step in flight prefills
        self.step_log = step_log
        self._step_ended: dict[int, float] = {}  # worker -> when its last step's result was handled
        self.remaps: dict[int, float] = {}  # worker -> when its resize_kv was sent
        self.replacing: set[int] = set()
        self.losses: list[dict] = []  # every worker lost: when, why, how many requests restarted
        self.kv_bytes_sent = 0  # KV payload bytes the engines exported for moves (fallbacks' included)
        self.kv_move_fallbacks = 0  # KV moves resent whole: the destination had evicted the blocks they skipped
        self.kv_tiers = KVTierMeter()  # the engines' KV store traffic and block residency
        self.recent: RecentWindow | None = None  # the last minute, for the live view

    def active(self) -> bool:
        return self.running

    # --- requests -----------------------------------------------------------------------
    def add(self, live: Live) -> None:
        self.live[live.request.id] = live
        self.outstanding += 1
        if self.tracer:
            self.tracer.begin(live.request, live.stream.request_id)
        self.submit(live.request)

    def abort(self, rid: int) -> None:
        live = self.live.get(rid)
        if live is None or live.finish_reason:
            return
        live.aborted = True
        req = live.request
        for w in self.workers:
            if req in w.queue and req.worker < 0:  # not started anywhere: drop it now
                w.dequeue(req)
                self._close(live, "abort")
                return
        if req in self.parked:  # waiting for a worker of its role
            self.parked.remove(req)
            self._close(live, "abort")

    def reject(self, req: Request) -> None:
        super().reject(req)
        if self.recent is not None:
            self.recent.on_failed(self.now)
        live = self.live.pop(req.id, None)
        if live:
            live.stream.put(TokenEvent([], "error", error="the request's KV cannot fit in one worker"))

    def finish(self, req: Request) -> None:
        super().finish(req)
        live = self.live.pop(req.id, None)
        if live is None:
            return
        reason = self.end_reason(req, live)
        if live.aborted and live.engine_worker >= 0:  # the engine still holds it: drop it there
            self.backends[live.engine_worker].submit("abort", live.engine_id)
        for event in groups.end_events(live, reason):
            live.stream.put(event)

    def end_reason(self, req: Request, live: Live | None = None) -> str:
        live = live or self.live.get(req.id)
        if live is None:
            return "length"
        return live.finish_reason or ("abort" if live.aborted else "length")

    def fail(self, req: Request, reason: str) -> None:
        super().fail(req, reason)
        if self.recent is not None:
            self.recent.on_failed(self.now)
        live = self.live.pop(req.id, None)
        if live is None:
            return
        if live.engine_worker >= 0:
            self.backends[live.engine_worker].submit("abort", live.engine_id)
        live.stream.put(TokenEvent([], "error", error=reason))

    def _close(self, live: Live, reason: str) -> None:
        self.live.pop(live.request.id, None)
        self.outstanding -= 1
        if self.tracer:
            self.tracer.finish(live.request, self.now, reason)
        live.stream.put(TokenEvent([], reason))

    # --- steps --------------------------------------------------------------------------
    def execute(self, w: WorkerState, plan: StepPlan, shape: StepShape) -> None:
        from fluidpd.engine.plan import PrefillChunk
        from fluidpd.engine.plan import StepPlan as EnginePlan

        backend = self.backends[w.id]
        prefills = []
        for req, c in plan.chunks:
            live = self.live[req.id]
            cached = 0
            if live.engine_worker != w.id:  # its first chunk here: the World applied its cache hit
                self._add_to_engine(live, w.id)
                cached = live.planned_cached = req.prefilled
            prefills.append(PrefillChunk(live.engine_id, c, cached))
        decodes = [self.live[r.id].engine_id for r in w.decoding.values()] if plan.decode else []
        self.step_started[w.id] = self.now
        self.running_kinds[w.id] = plan.kind
        self.step_prefills[w.id] = [r.id for r, _ in plan.chunks]
        busy = (len(self.running_kinds), sum(k != "decode" for k in self.running_kinds.values()))
        fut = backend.submit("run_step", EnginePlan(prefills=prefills, decodes=decodes))
        fut.add_done_callback(lambda f: self.loop.soon(self._stepped, w, plan, f, shape, busy))

    def _add_to_engine(self, live: Live, wid: int) -> None:
        """Add the request to worker `wid`'s engine: its prompt plus what it already generated
        (a recompute after preemption), for the tokens it still may generate."""
        from dataclasses import replace

        live.admissions += 1
        live.engine_id = f"{live.request.id}.{live.admissions}"
        live.engine_worker = wid
        req = live.request
        if req.n > 1:  # a group: its choices' tokens so far (its prompt is computed once)
            ids, group_params, produced = groups.engine_args(live)
            fut = self.backends[wid].submit("add_request", live.engine_id, ids, group_params, produced)
            fut.add_done_callback(lambda f: self.loop.soon(self._admitted, live, f))
            return
        params = replace(
            live.params, max_tokens=max(0, live.params.max_tokens - req.generated), prompt_logprobs=rescoring(live)
        )
        fut = self.backends[wid].submit("add_request", live.engine_id, live.prompt_ids + live.out_ids, params)
        fut.add_done_callback(lambda f: self.loop.soon(self._admitted, live, f))

    def _admitted(self, live: Live, fut) -> None:
        exc = fut.exception()
        if exc is not None and not isinstance(exc, WorkerError):
            log.warning("request %s refused by worker %d's engine: %s", live.engine_id, live.engine_worker, exc)
            # a ValueError says what is wrong with the request; anything else is internal (logged)
            live.error = f"refused by its engine: {exc}" if isinstance(exc, ValueError) else "refused by its engine"

    def _stepped(self, w: WorkerState, plan: StepPlan, fut, shape: StepShape, busy: tuple[int, int]) -> None:
        if self.workers[w.id] is not w or not self.running:  # lost meanwhile (its requests restarted), or stopped
            return
        self.running_kinds.pop(w.id, None)
        self.step_prefills.pop(w.id, None)
        try:
            result = fut.result()
        except WorkerError as exc:  # the worker is gone: its requests start over elsewhere
            self.worker_down(w.id, f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - the step did not run: it fails its culprits alone
            self._step_refused(w, plan, exc)
            return
        stopped = set()
        by_engine = {self.live[r.id].engine_id: self.live[r.id] for r, _ in plan.chunks}
        if plan.decode:
            by_engine.update({self.live[r.id].engine_id: self.live[r.id] for r in w.decoding.values()})
        for out in result.outputs:
            live = by_engine.get(out.request_id)
            if live is None:
                continue
            if live.planned_cached >= 0:
                self._cache_hit(w, live, out.num_cached_tokens, out.num_loaded_tokens)
            if live.request.n > 1:
                groups.on_output(w, live, out, stopped)
                continue
            if out.prompt_logprobs:
                live.prompt_logprobs = (live.prompt_logprobs or []) + out.prompt_logprobs
            if out.new_token_ids or (out.finished and not live.out_ids and live.params.max_tokens == 0):
                first, plp = first_event_extras(live)
                live.out_ids.extend(out.new_token_ids)
                live.stream.put(
                    TokenEvent(list(out.new_token_ids), logprobs=out.logprobs, cached_tokens=first, prompt_logprobs=plp)
                )
                if live.request.block_hashes:
                    extend_hashes(live, w.block_size)
            if out.finished or live.aborted:
                stopped.add(live.request.id)
                if out.finished:
                    live.finish_reason = "stop" if out.finish_reason == "stop" else "length"
                    live.engine_worker = -1
        self.kv_tiers.add(result.kv_tiers)
        if self.step_log is not None:
            self._log_step(self.step_log, w, plan, shape, busy, result)
        self.step_end(w, plan, result.step_s, frozenset(stopped))

    def _cache_hit(self, w: WorkerState, live: Live, engine_hit: int, engine_loaded: int = 0) -> None:
        """The engine's answer to the hit its admission planned: where it held fewer of the blocks
        than the World expected (it computed them in the step instead), the engine's figures count
        (the hit, and the part of it loaded from the KV store)."""
        req, planned = live.request, live.planned_cached
        live.planned_cached = -1
        if engine_hit >= planned:
            return
        w.prefix_cache_corrections += 1
        if req.cached_tokens == planned and req.preemptions == 0:  # its first admission: the counted one
            w.prefix_cache_hits -= planned - engine_hit
            w.host_hits -= req.loaded_tokens - engine_loaded
            req.cached_tokens, req.loaded_tokens = engine_hit, engine_loaded

    def _log_step(self, log: StepLog, w: WorkerState, plan: StepPlan, shape: StepShape, busy, result) -> None:
        now, start = self.now, self.step_started[w.id]
        idle = start - self._step_ended.get(w.id, start)
        self._step_ended[w.id] = now
        cpu = time.process_time()
        engine = (result.step_s, result.cpu_s)
        log.write(StepRecord(w.id, plan.kind, start, *busy, *engine, now - start, idle, cpu, shape))

    def _step_refused(self, w: WorkerState, plan: StepPlan, exc: Exception) -> None:
        """The engine refused the step: the requests it refused at admission fail; if none did,
        every request of the step is a suspect and fails (so a bad request cannot loop)."""
        planned = [r for r, _ in plan.chunks] + (list(w.decoding.values()) if plan.decode else [])
        culprits = [r for r in planned if self.live[r.id].error]
        if not culprits:
            culprits = planned
            log.error(
                "worker %d: step failed (%s: %s); failing its %d requests", w.id, type(exc).__name__, exc, len(planned)
            )
        default = "the engine failed the step (see the server log)"
        self.step_failed(w, plan, [(r, self.live[r.id].error or default) for r in culprits])

    def preempt(self, w: WorkerState, req: Request) -> None:
        live = self.live[req.id]
        self.backends[w.id].submit("abort", live.engine_id)
        live.engine_worker = -1
        groups.restarting(req)
        super().preempt(w, req)
