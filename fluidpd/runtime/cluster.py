"""The real world: the shared World lifecycle whose steps run on engine workers, on the wall clock.

Every step the policy plans is sent to the worker's engine as an explicit plan (prefill chunks,
decode ids); the engine's tokens stream to the requests, and the measured step time goes back to
the policy. KV moves by export on one engine and import on another (through the transport the
worker backends use). FluidRole's remap is a real `resize_kv` of the worker's arena.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from fluidpd.core.metrics import MetricsCollector
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.actions import RunPhase
from fluidpd.policy.base import Policy
from fluidpd.policy.view import StepPlan
from fluidpd.runtime.api import TokenEvent
from fluidpd.runtime.messages import WorkerError
from fluidpd.world.lifecycle import World
from fluidpd.world.worker import WorkerState

log = logging.getLogger("fluidpd.runtime")


@dataclass(slots=True, eq=False)
class Live:
    """What the runtime keeps of a request besides the shared Request: ids, tokens, its stream."""

    request: Request
    prompt_ids: list[int]
    params: object
    stream: object
    out_ids: list[int] = field(default_factory=list)
    engine_id: str = ""
    engine_worker: int = -1  # the engine that holds it now (-1: none)
    admissions: int = 0
    aborted: bool = False
    finish_reason: str | None = None
    error: str | None = None  # why its engine refused it


class RuntimeCluster(World):
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
    ):
        super().__init__(policy, kv_bytes_per_token, kv_blocks, metrics, len(backends), block_size, lambda i: 0, loop)
        self.backends = backends
        self.prefill_kv_fraction = prefill_kv_fraction
        self.live: dict[int, Live] = {}
        self.failed: str | None = None
        self.running = True

    def active(self) -> bool:
        return self.running

    # --- requests -----------------------------------------------------------------------
    def add(self, live: Live) -> None:
        self.live[live.request.id] = live
        self.outstanding += 1
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

    def reject(self, req: Request) -> None:
        super().reject(req)
        live = self.live.pop(req.id, None)
        if live:
            live.stream.put(TokenEvent([], "error", error="the request's KV cannot fit in one worker"))

    def finish(self, req: Request) -> None:
        super().finish(req)
        live = self.live.pop(req.id, None)
        if live is None:
            return
        reason = live.finish_reason or ("abort" if live.aborted else "length")
        if live.aborted and live.engine_worker >= 0:  # the engine still holds it: drop it there
            self.backends[live.engine_worker].submit("abort", live.engine_id)
        live.stream.put(TokenEvent([], reason))

    def fail(self, req: Request, reason: str) -> None:
        super().fail(req, reason)
        live = self.live.pop(req.id, None)
        if live is None:
            return
        if live.engine_worker >= 0:
            self.backends[live.engine_worker].submit("abort", live.engine_id)
        live.stream.put(TokenEvent([], "error", error=reason))

    def _close(self, live: Live, reason: str) -> None:
        self.live.pop(live.request.id, None)
        self.outstanding -= 1
        live.stream.put(TokenEvent([], reason))

    # --- steps --------------------------------------------------------------------------
    def execute(self, w: WorkerState, plan: StepPlan, shape: StepShape) -> None:
        from fluidpd.engine.plan import PrefillChunk
        from fluidpd.engine.plan import StepPlan as EnginePlan

        backend = self.backends[w.id]
        prefills = []
        for req, c in plan.chunks:
            live = self.live[req.id]
            if live.engine_worker != w.id:
                self._admit(live, w.id)
            prefills.append(PrefillChunk(live.engine_id, c))
        decodes = [self.live[r.id].engine_id for r in w.decoding.values()] if plan.decode else []
        fut = backend.submit("run_step", EnginePlan(prefills=prefills, decodes=decodes))
        fut.add_done_callback(lambda f: self.loop.soon(self._stepped, w, plan, f))

    def _admit(self, live: Live, wid: int) -> None:
        """Add the request to worker `wid`'s engine: its prompt plus what it already generated
        (a recompute after preemption), for the tokens it still may generate."""
        from dataclasses import replace

        live.admissions += 1
        live.engine_id = f"{live.request.id}.{live.admissions}"
        live.engine_worker = wid
        req = live.request
        params = replace(live.params, max_tokens=req.output_len - req.generated)
        fut = self.backends[wid].submit("add_request", live.engine_id, live.prompt_ids + live.out_ids, params)
        fut.add_done_callback(lambda f: self.loop.soon(self._admitted, live, f))

    def _admitted(self, live: Live, fut) -> None:
        exc = fut.exception()
        if exc is not None and not isinstance(exc, WorkerError):
            live.error = f"refused by its engine: {exc}"

    def _stepped(self, w: WorkerState, plan: StepPlan, fut) -> None:
        try:
            result = fut.result()
        except WorkerError as exc:  # the worker is gone: everything on it fails visibly
            self._worker_failed(w, plan, exc)
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
            if out.new_token_ids:
                live.out_ids.extend(out.new_token_ids)
                live.stream.put(TokenEvent(list(out.new_token_ids), logprobs=out.logprobs))
            if out.finished or live.aborted:
                stopped.add(live.request.id)
                if out.finished:
                    live.finish_reason = "stop" if out.finish_reason == "stop" else "length"
                    live.engine_worker = -1
        self.step_end(w, plan, result.step_s, frozenset(stopped))

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
        default = f"the engine failed the step: {type(exc).__name__}: {exc}"
        self.step_failed(w, plan, [(r, self.live[r.id].error or default) for r in culprits])

    def _worker_failed(self, w: WorkerState, plan: StepPlan, exc: Exception) -> None:
        self.failed = f"worker {w.id}: {type(exc).__name__}: {exc}"
        w.busy = False
        w.routable = False
        victims = [r for r, _ in plan.chunks] + list(w.decoding.values()) + list(w.queue)
        for req in victims:
            live = self.live.pop(req.id, None)
            if live is not None:
                self.outstanding -= 1
                live.stream.put(TokenEvent([], "error", error=self.failed))

    def preempt(self, w: WorkerState, req: Request) -> None:
        live = self.live[req.id]
        self.backends[w.id].submit("abort", live.engine_id)
        live.engine_worker = -1
        super().preempt(w, req)

    # --- KV moves and phases ------------------------------------------------------------
    def transfer(self, req, src: WorkerState, dst: WorkerState, tokens: int, cls: str, done, arg) -> None:
        live = self.live[req.id]

        def imported(f) -> None:  # on the loop
            if f.exception() is not None:
                self._transfer_failed(live, src, dst, f.exception(), dst)
                return
            live.engine_worker = dst.id
            done(arg)

        def exported(f) -> None:  # on the source backend's thread
            if f.exception() is not None:
                self.loop.soon(self._transfer_failed, live, src, dst, f.exception(), src)
                return
            nxt = self.backends[dst.id].submit("import_kv", f.result(), None, live.engine_id)
            nxt.add_done_callback(lambda g: self.loop.soon(imported, g))

        self.backends[src.id].submit("export_kv", live.engine_id).add_done_callback(exported)

    def _transfer_failed(
        self, live: Live, src: WorkerState, dst: WorkerState, exc: BaseException, side: WorkerState
    ) -> None:
        """A hand-off or migration did not complete: the request fails alone, both sides free its KV."""
        req = live.request
        log.error(
            "KV move of request %d from worker %d to %d failed: %s: %s", req.id, src.id, dst.id, type(exc).__name__, exc
        )
        src.held.pop(req.id, None)
        src.free(src.blocks_of(req))
        dst.free(dst.blocks_of(req))
        src.transfers_out -= 1
        dst.transfers_in -= 1
        self.schedule(src)
        self.schedule(dst)
        self.fail(req, f"moving its KV from worker {src.id} to worker {dst.id} failed: {type(exc).__name__}: {exc}")
        if isinstance(exc, WorkerError):
            self._worker_failed(side, StepPlan(), exc)

    def run_phase(self, a: RunPhase, kv_blocks: int) -> None:
        if a.phase == "restart":
            raise RuntimeError("the runtime changes roles in place (FluidRole); it does not model restarts")
        if a.phase != "remap":
            self.loop.soon(self.phase_end, a)
            return
        fut = self.backends[a.worker].submit("resize_kv", kv_blocks)
        fut.add_done_callback(lambda f: self.loop.soon(self._remapped, a, f))

    def _remapped(self, a: RunPhase, fut) -> None:
        fut.result()
        self.phase_end(a)
