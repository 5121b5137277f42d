"""The request lifecycle both worlds share: routing, the control and sampling cycles, each worker's steps
(`steps`: planning, token accounting, preemption), pull-based KV hand-off (`handoff`), failures
(`failures`) and the elastic actions (`elastic`, `recovery`). A world supplies the clock (`loop`), how a
step runs (`execute`), how KV moves (`transfer`) and how long FluidRole's phases take (`run_phase`)."""

from __future__ import annotations

from collections.abc import Sequence

from fluidpd.core.metrics import MetricsCollector
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.base import Policy
from fluidpd.policy.routing import NoRoutableWorker
from fluidpd.policy.view import StepPlan
from fluidpd.world.elastic import Elastic
from fluidpd.world.events import EventKind
from fluidpd.world.failures import Failures
from fluidpd.world.handoff import Handoff
from fluidpd.world.recovery import Recovery
from fluidpd.world.steps import Steps
from fluidpd.world.timeline import Timeline
from fluidpd.world.trace import RequestTracer
from fluidpd.world.worker import WorkerState

# (module constants: an enum member read through its class costs a dictionary miss per step)
CONTROL, SAMPLE, SCHEDULE = EventKind.CONTROL, EventKind.SAMPLE, EventKind.SCHEDULE


class World(Steps, Handoff, Failures, Elastic, Recovery):
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
