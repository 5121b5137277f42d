"""The simulated world: workers whose steps cost what the latency model says, driven by a policy."""
from __future__ import annotations

import math

import numpy as np

from fluidpd.core.metrics import MetricsCollector
from fluidpd.core.piece import PrefillPiece
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.base import Policy
from fluidpd.policy.view import StepPlan, blocks_for
from fluidpd.sim.config import SimConfig
from fluidpd.sim.elastic import Elastic
from fluidpd.sim.events import EventKind, EventLoop
from fluidpd.sim.network import HANDOFF, Network
from fluidpd.sim.timeline import Timeline
from fluidpd.sim.worker import SimWorker
from fluidpd.workload.trace import Trace

EWMA = 0.2


class SimCluster(Elastic):
    """Implements the policy's ClusterView on a virtual clock; every step planned by the policy."""

    def __init__(self, trace: Trace, policy: Policy, step_time, kv_bytes_per_token: float,
                 kv_blocks: int, network: Network, metrics: MetricsCollector, config: SimConfig):
        self.trace, self.policy, self.config = trace, policy, config
        self.step_time = step_time
        self.kv_bytes_per_token = kv_bytes_per_token
        self.network, self.metrics = network, metrics
        self.loop = EventLoop()
        self.rng = np.random.default_rng(config.seed)
        self.slo_tbt = metrics.slo.tbt_s
        roles = policy.roles(config.n_workers)
        self.workers = [SimWorker(i, r, config.node_of(i), kv_blocks, config.block_size)
                        for i, r in enumerate(roles)]
        self.outstanding = 0
        self.timeline = Timeline(len(self.workers))
        self._progress = None
        self.spreads: dict = {}
        self._jitter_sigma = math.sqrt(math.log1p(config.step_jitter_cv ** 2))

    @property
    def now(self) -> float:
        return self.loop.now

    # --- driving ------------------------------------------------------------------------
    def run(self, progress=None) -> None:
        """Run to completion (or the drain horizon); `progress(now, completed)` is called each sample."""
        self._progress = progress
        t = self.trace
        self._arrivals = (t.arrival_s.tolist(), t.prompt_len.tolist(), t.output_len.tolist())
        if len(t):
            self.loop.at(self._arrivals[0][0], EventKind.ARRIVAL, self._arrive, 0)
            self.loop.at(0.0, EventKind.SAMPLE, self._sample)
            if self.policy.uses_tick:
                self.loop.at(0.0, EventKind.CONTROL, self._control)
        horizon = (float(t.arrival_s[-1]) if len(t) else 0.0) + self.config.drain_s
        self.loop.run(until=horizon)

    def _arrive(self, i: int) -> None:
        arrival, prompt, output = self._arrivals
        if i + 1 < len(arrival):  # queued first, so a same-instant arrival is seen before planning
            self.loop.at(arrival[i + 1], EventKind.ARRIVAL, self._arrive, i + 1)
        req = Request(i, arrival[i], prompt[i], output[i])
        self.outstanding += 1
        self.submit(req)

    def submit(self, req: Request, front: bool = False) -> None:
        w = self.workers[self.policy.route(req, self)]
        if blocks_for(req.prompt_len + req.output_len, w.block_size) > w.kv_blocks_total:
            self.reject(req)
            return
        w.enqueue(req, front)
        self.schedule(w)

    def _control(self, _=None) -> None:
        self.apply(self.policy.tick(self))
        if self.outstanding or self.loop.now < self.trace.arrival_s[-1]:
            self.loop.at(self.loop.now + self.policy.config.tick_s, EventKind.CONTROL, self._control)

    def _sample(self, _=None) -> None:
        self.timeline.sample(self.loop.now, self.workers)
        if self._progress:
            self._progress(self.loop.now, self.metrics.completed)
        if self.outstanding or self.loop.now < self.trace.arrival_s[-1]:
            self.loop.at(self.loop.now + self.config.sample_s, EventKind.SAMPLE, self._sample)

    # --- steps --------------------------------------------------------------------------
    def schedule(self, w: SimWorker) -> None:
        """Let `w` plan its next step once everything at this instant has happened."""
        if self.loop.quiet():
            self.kick(w)
        elif not w.schedule_pending:
            w.schedule_pending = True
            self.loop.at(self.loop.now, EventKind.SCHEDULE, self._scheduled, w)

    def _scheduled(self, w: SimWorker) -> None:
        w.schedule_pending = False
        self.kick(w)

    def kick(self, w: SimWorker) -> None:
        """Start `w`'s next step if it is idle and has work."""
        if w.busy:
            return
        w.busy = True  # while planning: a preemption below may re-submit to `w`
        plan = self.policy.plan_step(w, self)
        if plan.decode:
            plan.decode = self._make_room(w)
        if not plan:
            w.busy = False
            return
        shape = StepShape()
        if plan.decode:
            w.allocate(w.growth_blocks())
            n = len(w.decoding)
            shape.add_decodes(n, w.decode_ctx_sum + n)
        for i, (req, c) in enumerate(plan.chunks):
            if req.prefilled == 0:
                need = blocks_for(req.prefill_target, w.block_size)
                if need > w.free_blocks:  # decode growth took the room the planner counted on
                    del plan.chunks[i:]
                    break
                w.allocate(need)
                w.num_prefilling += 1
                req.worker = w.id
            shape.add_chunk(c, req.kv_prior)
        if not plan:
            w.busy = False
            return
        duration = self.step_time(shape)
        if self._jitter_sigma:
            duration *= float(self.rng.lognormal(-0.5 * self._jitter_sigma ** 2, self._jitter_sigma))
        w.steps += 1
        kind = "mixed" if plan.chunks and plan.decode else ("decode" if plan.decode else "prefill")
        w.busy_s[kind] += duration
        self.loop.at(self.loop.now + duration, EventKind.STEP_END, self._step_end, (w, plan, duration))

    def _make_room(self, w: SimWorker) -> bool:
        """Preempt (by recompute) until the next decode step's KV growth fits; False if none left."""
        while w.decoding and w.growth_blocks() > w.free_blocks:
            self.preempt(w, w.preemption_victim())
        return bool(w.decoding)

    def preempt(self, w: SimWorker, req: Request) -> None:
        w.leave(req)
        w.free(w.blocks_of(req))
        w.preemptions += 1
        req.preemptions += 1
        req.prefill_target = req.prompt_len + req.generated
        req.prefilled = 0
        req.worker = -1
        self.submit(req, front=True)

    def _step_end(self, arg: tuple[SimWorker, StepPlan, float]) -> None:
        w, plan, duration = arg
        now = self.loop.now
        w.busy = False
        self.policy.observe_step(w, duration, plan)
        if plan.decode and not plan.chunks:
            w.step_time_ewma_s += EWMA * (duration - w.step_time_ewma_s) if w.step_time_ewma_s else duration
        if plan.decode:
            for req in w.decode_tick(now, self.slo_tbt, self.metrics.on_gap):
                w.leave(req)
                w.free(w.blocks_of(req))
                self.finish(req)
        for req, c in plan.chunks:
            req.prefilled += c
            w.queued_tokens -= c
            if req.prefilled >= req.prefill_target:
                self._prefilled(w, req)
        w.join_incoming()
        if w.deferred:
            deferred, w.deferred = w.deferred, []
            self.apply(deferred)
        self.schedule(w)
        self.start_pulls(w)

    def _prefilled(self, w: SimWorker, req: Request) -> None:
        """A request's prefill finished on `w`: emit a token, then decode here or hand off."""
        w.dequeue(req)
        w.num_prefilling -= 1
        if isinstance(req, PrefillPiece):
            self.piece_done(w, req)
            return
        if req.generated:
            gap = self.loop.now - req.last_token_s
            self.metrics.on_gap(gap)
            req.add_gap(gap, self.slo_tbt)
        req.emit(self.loop.now)
        w.tokens_out += 1
        if req.finished:
            w.free(w.blocks_of(req))
            self.finish(req)
            return
        dst = self.policy.handoff(req, w, self)
        if dst is None or dst == w.id:
            w.join(req)
            return
        w.held[req.id] = req
        req.worker = w.id
        d = self.workers[dst]
        d.pulls.append(req)
        d.pull_blocks_pending += w.blocks_of(req)
        self.start_pulls(d)

    # --- pull-based KV hand-off ---------------------------------------------------------
    def start_pulls(self, d: SimWorker) -> None:
        """A decode worker fetches queued KV, FCFS, while its memory and batch have room."""
        limit = self.policy.config.max_num_seqs
        while d.pulls:
            req = d.pulls[0]
            need = d.blocks_of(req)
            if need > d.free_blocks or len(d.decoding) >= limit:
                return
            d.pulls.popleft()
            d.pull_blocks_pending -= need
            d.allocate(need)
            src = self.workers[req.worker]
            src.transfers_out += 1
            d.transfers_in += 1
            nbytes = SimWorker.stored(req) * self.kv_bytes_per_token
            end = self.network.schedule(self.loop.now, nbytes, src.node, d.node, d.id, HANDOFF)
            self.loop.at(end, EventKind.TRANSFER_END, self._pulled, (req, src, d))

    def _pulled(self, arg: tuple[Request, SimWorker, SimWorker]) -> None:
        req, src, d = arg
        del src.held[req.id]
        src.free(src.blocks_of(req))
        src.transfers_out -= 1
        d.transfers_in -= 1
        req.moved = True
        d.join(req)
        self.schedule(d)
        self.schedule(src)

    def reject(self, req: Request) -> None:
        """A request whose KV can never fit in one worker fails visibly instead of waiting forever."""
        self.outstanding -= 1
        self.metrics.rejected += 1

    def finish(self, req: Request) -> None:
        req.finish_s = self.loop.now
        req.last_token_s = self.loop.now
        req.worker = -1
        self.outstanding -= 1
        self.metrics.on_finish(req)
