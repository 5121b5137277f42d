"""A worker's step as both worlds run it: planned by the policy and started (`kick`: room made for the
decodes' KV growth, preempting by recompute if short; the unstarted chunks admitted on their cached
prefixes), then accounted when it ends (`step_end`: tokens, finished requests, completed prefills
decoded where they are or handed off)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fluidpd.core.piece import PrefillPiece
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.view import Role, StepPlan, blocks_for
from fluidpd.world.events import EventKind
from fluidpd.world.worker import WorkerState

if TYPE_CHECKING:
    from fluidpd.core.metrics import MetricsCollector
    from fluidpd.policy.base import Policy
    from fluidpd.world.trace import RequestTracer

EWMA = 0.2
# (module constants: an enum member read through its class costs a dictionary miss per step)
SCHEDULE = EventKind.SCHEDULE
DECODE = Role.DECODE


class Steps:
    """Mixin of World: start a worker's next step (`kick`), account it when it ends (`step_end`)."""

    if TYPE_CHECKING:  # what World provides
        policy: Policy
        loop: Any
        workers: list[WorkerState]
        metrics: MetricsCollector
        slo_tbt: float
        tracer: RequestTracer | None

        @property
        def now(self) -> float: ...
        def execute(self, w: WorkerState, plan: StepPlan, shape: StepShape) -> None: ...
        def host_loaded(self, w: WorkerState, blocks: int) -> float: ...
        def submit(self, req: Request, front: bool = False, in_order: bool = False) -> None: ...
        def schedule(self, w: WorkerState) -> None: ...
        def _scheduled(self, w: WorkerState) -> None: ...
        def finish(self, req: Request) -> None: ...
        def apply(self, actions: list) -> None: ...
        def start_pulls(self, d: WorkerState) -> None: ...
        def piece_done(self, w, piece: PrefillPiece) -> None: ...
        def decode_or_hand_off(self, w: WorkerState, req: Request) -> None: ...

    def kick(self, w: WorkerState) -> None:
        """Start `w`'s next step if it is idle and has work."""
        if w.busy:
            return
        w.busy = True  # while planning: a preemption below may re-submit to `w`
        plan = self.policy.plan_step(w, self)
        decode = plan.decode
        if decode:
            growth = w.growth_blocks()
            if growth > w.free_blocks or not w.decoding:  # (else `_make_room` has nothing to do)
                decode = self._make_room(w)
                growth = w.growth_blocks()
            decode = plan.decode = bool(decode)
        chunks = plan.chunks
        if not chunks and not decode:  # (not `not plan`: a __bool__ call costs a step 2%)
            w.busy = False
            return
        if decode:
            for joiner in w.joiners:
                if joiner.held_first:
                    joiner.first_token_s = joiner.last_token_s = self.loop.now
                    joiner.held_first = False
            w.step_growth = growth
            w.allocate(growth)
            n = w.decode_rows  # sequences: a request group's live ones each
            # (positional: the decode rows, their context, the masked ones; no prefill yet)
            shape = StepShape(0, 0, 0.0, 0, n, w.decode_ctx_sum + n, w.decode_masked)
        else:
            w.step_growth = 0
            shape = StepShape()
        if w.admitted:
            w.admitted = []
        if chunks:
            plan.chunks = self._start_chunks(w, chunks, shape)
            if not plan.chunks and not decode:
                w.busy = False
                return
        w.steps += 1
        if self.tracer:
            self.tracer.step_started(w, self.loop.now)
        self.execute(w, plan, shape)

    def _start_chunks(self, w: WorkerState, planned: list, shape: StepShape) -> list:
        """The planned chunks that run now (admitting the unstarted ones while there is room), added
        to `shape`; a chunk whose prefix is still loading from the host tier waits (`w` is woken then)."""
        now, chunks, wake, full = self.loop.now, [], math.inf, False
        for req, c in planned:
            if req.prefilled == 0:
                need = (
                    w.prefill_blocks(req) if isinstance(req, Request) else blocks_for(req.prefill_target, w.block_size)
                )
                # decode growth took the room the planner counted on: no admission from here on (the
                # requests already started, which hold their KV, go on: else they could wait forever)
                full = full or need > w.free_blocks
                if full:
                    continue
                if self._admit(w, req, need):  # a cached prefix: the chunk starts after it
                    c = min(c, req.prefill_remaining)
            if isinstance(req, Request) and req.kv_ready_s > now:  # its prefix is still loading: not yet
                wake = min(wake, req.kv_ready_s)
                continue
            chunks.append((req, c))
            shape.add_chunk(c, req.kv_prior)
        if wake < math.inf:
            self.loop.at(wake, SCHEDULE, self._scheduled, w)
        return chunks

    def _admit(self, w: WorkerState, req: Request | PrefillPiece, need: int) -> int:
        """`req` starts prefilling on `w`: it holds its cached prefix there (a hit advances `prefilled`
        past it; counted at its first admission only, not for a recompute) and `need` blocks in all."""
        hit, loaded = w.take_cached(req) if isinstance(req, Request) else (0, 0)
        if loaded:
            req.kv_ready_s = self.host_loaded(w, loaded)  # type: ignore[union-attr]
        w.started(req)
        w.allocate(need - hit // w.block_size)
        w.num_prefilling += 1
        w.admitted.append(req)
        req.worker = w.id
        if isinstance(req, Request) and not req.cache_queried:
            req.cache_queried = True
            req.cached_tokens, req.loaded_tokens = hit, loaded * w.block_size
            w.prefix_cache_queries += req.prompt_len
            w.prefix_cache_hits += hit
            w.host_hits += loaded * w.block_size
        if self.tracer:
            self.tracer.admitted(req, w, self.loop.now, hit, loaded)
        if hit:
            req.prefilled = hit
            w.queued_tokens -= hit
        return hit

    def _make_room(self, w: WorkerState) -> bool:
        """Preempt (by recompute) until the next decode step's KV growth fits; False if none left."""
        while w.decoding and w.growth_blocks() > w.free_blocks:
            self.preempt(w, w.preemption_victim())
        return bool(w.decoding)

    def preempt(self, w: WorkerState, req: Request) -> None:
        w.leave(req)
        w.release(req)  # its blocks stay cached: the recompute may hit them
        w.preemptions += 1
        req.preemptions += 1
        if self.tracer:
            self.tracer.mark(req, "preempted", self.loop.now, w.id)
        req.start_over()
        self.submit(req, front=True)

    def step_end(self, w: WorkerState, plan: StepPlan, duration: float, stopped: frozenset = frozenset()) -> None:
        """Account a finished step: tokens, finished requests (`stopped`: ended early by the
        engine, e.g. EOS), completed prefills, deferred actions; then plan the next step."""
        now = self.loop.now
        w.busy = False
        chunks, decode = plan.chunks, plan.decode  # (plan.kind, without a property call per step)
        w.busy_s["mixed" if chunks and decode else ("decode" if decode else "prefill")] += duration
        self.policy.observe_step(w, duration, plan)
        chunks, decode = plan.chunks, plan.decode
        if decode:
            if not chunks:
                w.step_time_ewma_s += EWMA * (duration - w.step_time_ewma_s) if w.step_time_ewma_s else duration
            for done in w.decode_tick(now, self.slo_tbt, self.metrics.on_gap, stopped):
                w.leave(done)
                w.release(done)
                self.finish(done)
        if chunks and w.role is DECODE:
            w.borrowed_chunks += len(chunks)
        if self.tracer:
            self.tracer.chunks_done(w, chunks, now)
        for req, c in chunks:
            req.prefilled += c
            w.queued_tokens -= c
            if req.prefilled >= req.prefill_target:
                self._prefilled(w, req, stopped)
        if w.incoming:
            w.join_incoming()
        if w.deferred:
            deferred, w.deferred = w.deferred, []
            self.apply(deferred)
        self.schedule(w)
        if w.pulls:
            self.start_pulls(w)

    def _prefilled(self, w: WorkerState, req: Request | PrefillPiece, stopped: frozenset = frozenset()) -> None:
        """A request's prefill finished on `w`: emit a token, then decode here or hand off."""
        w.dequeue(req)
        w.num_prefilling -= 1
        if isinstance(req, PrefillPiece):
            self.piece_done(w, req)
            return
        w.register(req, req.prefill_target)
        if req.generated:
            gap = self.loop.now - req.last_token_s
            self.metrics.on_gap(gap)
            req.add_gap(gap, self.slo_tbt)
        req.emit(self.loop.now)
        w.tokens_out += req.live
        if req.finished or req.id in stopped:
            w.release(req)
            self.finish(req)
            return
        self.decode_or_hand_off(w, req)
