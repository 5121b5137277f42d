"""The request lifecycle both worlds share: routing, step planning, token accounting, pull-based
KV hand-off (`handoff`), preemption, failures (`failures`) and the elastic actions (`elastic`,
`recovery`). A world supplies the clock (`loop`), how a step runs (`execute`), how KV moves
(`transfer`) and how long FluidRole's phases take (`run_phase`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fluidpd.core.metrics import MetricsCollector
from fluidpd.core.piece import PrefillPiece
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.base import Policy
from fluidpd.policy.routing import NoRoutableWorker
from fluidpd.policy.view import Role, StepPlan, blocks_for
from fluidpd.world.elastic import Elastic
from fluidpd.world.events import EventKind
from fluidpd.world.failures import Failures
from fluidpd.world.handoff import Handoff
from fluidpd.world.recovery import Recovery
from fluidpd.world.timeline import Timeline
from fluidpd.world.trace import RequestTracer
from fluidpd.world.worker import WorkerState

EWMA = 0.2
# (module constants: an enum member read through its class costs a dictionary miss per step)
CONTROL, SAMPLE, SCHEDULE = EventKind.CONTROL, EventKind.SAMPLE, EventKind.SCHEDULE
DECODE = Role.DECODE


class World(Handoff, Failures, Elastic, Recovery):
    """Implements the policy's ClusterView over WorkerStates; every step planned by the policy."""

    def __init__(
        self,
        policy: Policy,
        kv_bytes_per_token: float,
        kv_blocks: int | Sequence[int],
        metrics: MetricsCollector,
        n_workers: int,
        block_size: int,
        node_of,
        loop,
    ):
        self.policy, self.metrics, self.loop = policy, metrics, loop
        self.kv_bytes_per_token = kv_bytes_per_token
        self.slo_tbt = metrics.slo.tbt_s
        roles = policy.roles(n_workers)
        blocks = [kv_blocks] * n_workers if isinstance(kv_blocks, int) else list(kv_blocks)
        if len(blocks) != n_workers:
            raise ValueError(f"{len(blocks)} KV sizes for {n_workers} workers")
        self.workers = [WorkerState(i, r, node_of(i), blocks[i], block_size) for i, r in enumerate(roles)]
        self.outstanding = 0
        self.kv_tokens_moved = 0  # KV tokens hand-offs and migrations sent over links
        self.timeline = Timeline(len(self.workers))
        self.spreads: dict = {}
        self.prefill_kv_fraction = 1.0
        self.prefill_kv_floor = 1  # a prefill worker's arena keeps at least this many KV blocks
        # a handed-off request's first token is released with its first decode step on the decode
        # worker (TTFT a transfer and at most a step later; the hand-off gap bounded by one step)
        self.hold_first_token = False
        self.tracer: RequestTracer | None = None  # per-request timelines (off unless a world sets one)
        self.init_recovery()

    @property
    def now(self) -> float:
        return self.loop.now

    @property
    def kv_bytes_moved(self) -> float:
        """KV bytes hand-offs and migrations sent between workers."""
        return self.kv_tokens_moved * self.kv_bytes_per_token

    def kv_bytes(self, tokens: int) -> float:
        """Bytes of a sequence's last `tokens` tokens of KV, what a move sends."""
        return tokens * self.kv_bytes_per_token

    def active(self) -> bool:
        """Whether periodic events (control ticks, samples) keep running."""
        return True

    # --- world-specific ---------------------------------------------------------------------
    def execute(self, w: WorkerState, plan: StepPlan, shape: StepShape) -> None:
        """Run `plan` on `w`; when it is done, call `step_end(w, plan, duration_s, stopped)`."""
        raise NotImplementedError

    def transfer(
        self, req, src: WorkerState, dst: WorkerState, tokens: int, cls: str, done, arg, skip_blocks: int = 0
    ) -> None:
        """Move `tokens` tokens of `req`'s KV from `src` to `dst`, leaving out its first `skip_blocks`
        full blocks (`dst` holds them cached); then call `done(arg)`."""
        raise NotImplementedError

    def host_loaded(self, w: WorkerState, blocks: int) -> float:
        """`w` copies `blocks` KV blocks from its host tier into its arena for a request it admits
        now; when they are there (a world that times the copy: later, and the request's chunks wait)."""
        return self.loop.now

    def on_sample(self) -> None:
        """Called after every timeline sample."""

    def submit(self, req: Request, front: bool = False, in_order: bool = False) -> None:
        if self.policy.prefilled_arrivals and req.generated == 0:
            self._arrive_prefilled(req)
            return
        try:
            w = self.workers[self.policy.route(req, self)]
        except NoRoutableWorker:  # e.g. its role's only worker died: it waits for one
            self.parked.append(req)
            return
        if (
            w.group_blocks(req, req.prompt_len + req.output_len) > w.kv_blocks_full
            or w.prefill_blocks(req) > w.kv_blocks_total
        ):
            self.reject(req)
            return
        w.enqueue(req, front, in_order)
        if self.tracer:
            self.tracer.queued(req, w, self.loop.now)
        self.schedule(w)

    def _control(self, _=None) -> None:
        try:
            self.apply(self.policy.tick(self))
        finally:  # a tick that raises is reported by the loop (the simulator stops, the runtime logs): control goes on
            if self.active():
                self.loop.at(self.loop.now + self.policy.config.tick_s, CONTROL, self._control)

    def _sample(self, period_s: float) -> None:
        self.timeline.sample(self.loop.now, self.workers)
        self.on_sample()
        if self.active():
            self.loop.at(self.loop.now + period_s, SAMPLE, self._sample, period_s)

    # --- steps --------------------------------------------------------------------------
    def schedule(self, w: WorkerState) -> None:
        """Let `w` plan its next step once everything at this instant has happened."""
        if self.workers[w.id] is not w:  # the state of a lost worker, seen by a late callback
            return
        if self.loop.quiet():
            self.kick(w)
        elif not w.schedule_pending:
            w.schedule_pending = True
            self.loop.at(self.loop.now, SCHEDULE, self._scheduled, w)

    def _scheduled(self, w: WorkerState) -> None:
        w.schedule_pending = False
        self.kick(w)

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

    def finish(self, req: Request) -> None:
        req.finish_s = self.loop.now
        req.last_token_s = self.loop.now
        req.worker = -1
        self.outstanding -= 1
        self.metrics.on_finish(req)
        if self.tracer:
            self.tracer.finish(req, self.loop.now, self.end_reason(req))

    def end_reason(self, req: Request) -> str:
        """Why a finished request ended, in OpenAI's words (a world that knows better says so)."""
        return "length"
