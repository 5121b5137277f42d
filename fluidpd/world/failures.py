"""Requests that end in error: a step the engine refused, and a request too large for any worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fluidpd.core.request import Request
from fluidpd.policy.view import StepPlan, blocks_for
from fluidpd.world.worker import WorkerState

if TYPE_CHECKING:
    from fluidpd.core.metrics import MetricsCollector
    from fluidpd.world.trace import RequestTracer


class Failures:
    """Mixin of World: undo a step that did not run, take a request out of every worker, end it in error."""

    if TYPE_CHECKING:  # what World provides
        loop: Any
        metrics: MetricsCollector
        workers: list[WorkerState]
        tracer: RequestTracer | None
        outstanding: int

        def schedule(self, w: WorkerState) -> None: ...
        def start_pulls(self, d: WorkerState) -> None: ...

    def step_failed(self, w: WorkerState, plan: StepPlan, culprits: list[tuple[Request, str]]) -> None:
        """`w`'s step did not run: undo what planning it reserved, fail the culprits (the requests
        that made it fail, each with its reason) and plan again; the others stay where they were."""
        w.busy = False
        w.free(w.step_growth)
        w.step_growth = 0
        bad = {r.id for r, _ in culprits}
        for req in w.admitted:
            if req.id not in bad and req.worker == w.id:  # admitted by this step: its cache hit undone
                w.num_prefilling -= 1
                if isinstance(req, Request):
                    w.release(req, w.prefill_blocks(req), 0)
                else:
                    w.free(blocks_for(req.prefill_target, w.block_size))
                w.queued_tokens += req.prefilled
                req.prefilled = 0
                req.worker = -1
        w.admitted = []
        for req, reason in culprits:
            self.drop(req)
            self.fail(req, reason)
        w.join_incoming()
        self.schedule(w)
        self.start_pulls(w)

    def drop(self, req: Request) -> None:
        """Take `req` out of every worker (queued, prefilling, decoding, held, awaiting a pull)
        and free its KV; not for a request whose KV is in flight between workers."""
        for w in self.workers:
            if req in w.queue:
                w.dequeue(req)
                if req.worker == w.id:
                    w.num_prefilling -= 1
                    w.release(req, w.prefill_blocks(req), req.prefilled)
            elif req.id in w.decoding:
                w.leave(req)
                w.release(req)
            elif req in w.incoming:
                w.incoming.remove(req)
                w.release(req)
            elif req.id in w.held:
                del w.held[req.id]
                w.release(req)
            if req in w.pulls:
                w.pulls.remove(req)
                w.pull_blocks_pending -= w.blocks_of(req)
            self.schedule(w)
        req.worker = -1

    def fail(self, req: Request, reason: str) -> None:
        """A request that cannot go on (its engine refused it): it ends visibly, counted as a miss."""
        self.outstanding -= 1
        self.metrics.failed += 1
        if self.tracer:
            self.tracer.finish(req, self.loop.now, "error", reason)

    def reject(self, req: Request) -> None:
        """A request whose KV can never fit in one worker fails visibly instead of waiting forever."""
        self.outstanding -= 1
        self.metrics.rejected += 1
        if self.tracer:
            self.tracer.finish(req, self.loop.now, "error", "its KV cannot fit in one worker")
