"""The real world: the shared World lifecycle whose steps run on engine workers, on the wall clock.

Every step the policy plans is sent to the worker's engine as an explicit plan (prefill chunks,
decode ids); the engine's tokens stream to the requests, and the measured step time goes back to
the policy. KV moves by export on one engine and import on another (through the transport the
worker backends use). FluidRole's remap is a real `resize_kv` of the worker's arena.

A worker that dies (its process exits, a call fails with WorkerError) or hangs (a heartbeat, which
a worker answers beside a step in progress, or a step or a remap unanswered past its timeout) is
lost: its requests start over on the others from their prompt plus the tokens already streamed
(`World.lose_worker`), so each stream goes on with no token lost or repeated; a replacement engine
starts in the background and joins in the role the policy wants; until then the cluster serves
smaller.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from fluidpd.core.metrics import MetricsCollector
from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.actions import RunPhase
from fluidpd.policy.base import Policy
from fluidpd.policy.view import StepPlan
from fluidpd.runtime.api import TokenEvent
from fluidpd.runtime.messages import WorkerError
from fluidpd.runtime.steplog import StepLog, StepRecord
from fluidpd.world.events import EventKind
from fluidpd.world.lifecycle import World
from fluidpd.world.worker import WorkerState

log = logging.getLogger("fluidpd.runtime")
WATCH_S = 0.25  # how often process exits and heartbeats are checked
REPLACE_ATTEMPTS = 3


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
        self.step_log = step_log
        self._step_ended: dict[int, float] = {}  # worker -> when its last step's result was handled
        self.remaps: dict[int, float] = {}  # worker -> when its resize_kv was sent
        self.replacing: set[int] = set()
        self.losses: list[dict] = []  # every worker lost: when, why, how many requests restarted

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
        if req in self.parked:  # waiting for a worker of its role
            self.parked.remove(req)
            self._close(live, "abort")

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
        self.step_started[w.id] = self.now
        self.running_kinds[w.id] = plan.kind
        busy = (len(self.running_kinds), sum(k != "decode" for k in self.running_kinds.values()))
        fut = backend.submit("run_step", EnginePlan(prefills=prefills, decodes=decodes))
        fut.add_done_callback(lambda f: self.loop.soon(self._stepped, w, plan, f, shape, busy))

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
            log.warning("request %s refused by worker %d's engine: %s", live.engine_id, live.engine_worker, exc)
            # a ValueError says what is wrong with the request; anything else is internal (logged)
            live.error = f"refused by its engine: {exc}" if isinstance(exc, ValueError) else "refused by its engine"

    def _stepped(self, w: WorkerState, plan: StepPlan, fut, shape: StepShape, busy: tuple[int, int]) -> None:
        if self.workers[w.id] is not w or not self.running:  # lost meanwhile (its requests restarted), or stopped
            return
        self.running_kinds.pop(w.id, None)
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
            if out.new_token_ids:
                live.out_ids.extend(out.new_token_ids)
                live.stream.put(TokenEvent(list(out.new_token_ids), logprobs=out.logprobs))
            if out.finished or live.aborted:
                stopped.add(live.request.id)
                if out.finished:
                    live.finish_reason = "stop" if out.finish_reason == "stop" else "length"
                    live.engine_worker = -1
        if self.step_log is not None:
            self._log_step(self.step_log, w, plan, shape, busy, result)
        self.step_end(w, plan, result.step_s, frozenset(stopped))

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

    # --- worker loss and replacement ----------------------------------------------------
    def watch(self, _=None) -> None:
        """Every WATCH_S: a worker whose process exited, or whose heartbeat or step is overdue, is lost.
        Heartbeats are answered out of band (beside a step in progress): one per worker in flight."""
        now = self.now
        for wid, b in enumerate(self.backends):
            if wid in self.down:
                continue
            sent, beat = self.pings.get(wid, (None, None))
            if beat is not None and beat.done() and beat.exception() is None:
                sent = None  # answered (read here: a busy loop must not delay the answer)
            started = self.step_started.get(wid)
            if getattr(b, "alive", True) is False:
                self.worker_down(wid, "its process exited")
            elif sent is not None and now - sent > self.heartbeat_timeout_s:
                self.worker_down(wid, f"no heartbeat for {self.heartbeat_timeout_s:g} s", kill=True)
            elif self.workers[wid].busy and started is not None and now - started > self.step_timeout_s:
                self.worker_down(wid, f"a step ran over {self.step_timeout_s:g} s", kill=True)
            elif wid in self.remaps and now - self.remaps[wid] > self.step_timeout_s:
                self.worker_down(wid, f"a remap ran over {self.step_timeout_s:g} s", kill=True)
            elif sent is None:
                self.pings[wid] = (now, b.submit("heartbeat"))
        if self.running:
            self.loop.at(now + WATCH_S, EventKind.CONTROL, self.watch)

    def worker_down(self, wid: int, why: str, kill: bool = False) -> None:
        """Worker `wid` is lost: its requests restart elsewhere; a replacement starts if it can."""
        if wid in self.down or not self.running:
            return
        backend = self.backends[wid]
        if kill and hasattr(backend, "kill"):
            backend.kill()
        restarted = self.lose_worker(wid)
        self.pings.pop(wid, None)
        self.step_started.pop(wid, None)
        self.running_kinds.pop(wid, None)
        self.remaps.pop(wid, None)
        self.losses.append({"worker": wid, "at_s": self.now, "reason": why, "restarted": len(restarted)})
        log.error("worker %d lost (%s); %d requests start over on the others", wid, why, len(restarted))
        if self.spawn is not None:
            self._replace(wid)

    def restart(self, req: Request) -> None:
        live = self.live.get(req.id)
        if live is not None:
            live.engine_worker = -1  # its engine (and KV) are gone: the next admission recomputes
        super().restart(req)

    def _replace(self, wid: int) -> None:
        self.replacing.add(wid)

        def run() -> None:  # on its own thread: starting an engine blocks for seconds
            err: BaseException | None = None
            for _ in range(REPLACE_ATTEMPTS):
                backend = self.spawn(wid)
                try:
                    backend.start()
                except Exception as exc:  # noqa: BLE001 - retried, then reported
                    err = exc
                    backend.close()
                    time.sleep(1.0)
                    continue
                self.loop.soon(self._replaced, wid, backend)
                return
            self.loop.soon(self._replace_failed, wid, err)

        threading.Thread(target=run, name=f"fluidpd-replace-{wid}", daemon=True).start()

    def _replaced(self, wid: int, backend) -> None:
        self.replacing.discard(wid)
        old, self.backends[wid] = self.backends[wid], backend
        threading.Thread(target=old.close, name=f"fluidpd-close-{wid}", daemon=True).start()
        if not self.running:
            backend.close()
            return
        role = self.policy.rejoin_role(wid, self.workers[wid].role, self)
        blocks = self.remap_blocks(self.workers[wid], role)
        if blocks == self.workers[wid].kv_blocks_full:
            self._rejoin(wid, role, backend)
            return
        fut = backend.submit("resize_kv", blocks)
        fut.add_done_callback(lambda f: self.loop.soon(self._rejoin, wid, role, backend, f))

    def _rejoin(self, wid: int, role, backend, fut=None) -> None:
        if self.backends[wid] is not backend or not self.running:
            return
        if fut is not None and fut.exception() is not None:
            self.worker_down(wid, f"its replacement failed to resize: {fut.exception()}")
            return
        self.rejoin_worker(wid, role)
        log.warning("worker %d replaced; it serves again as %s", wid, role.value)

    def _replace_failed(self, wid: int, err) -> None:
        self.replacing.discard(wid)
        log.error("worker %d could not be replaced after %d attempts: %s", wid, REPLACE_ATTEMPTS, err)
        if len(self.down) == len(self.workers):
            self.failed = f"every worker is lost; the last replacement failed: {err}"

    def preempt(self, w: WorkerState, req: Request) -> None:
        live = self.live[req.id]
        self.backends[w.id].submit("abort", live.engine_id)
        live.engine_worker = -1
        super().preempt(w, req)

    # --- KV moves and phases ------------------------------------------------------------
    def transfer(self, req, src: WorkerState, dst: WorkerState, tokens: int, cls: str, done, arg) -> None:
        live = self.live[req.id]
        self.moving.add(req.id)

        def imported(f) -> None:  # on the loop
            if f.exception() is not None:
                self._transfer_failed(live, src, dst, f.exception(), dst)
                return
            if self.workers[dst.id] is not dst:  # the destination died after the import
                self._transfer_failed(live, src, dst, WorkerError(f"worker {dst.id} was lost"), dst)
                return
            self.moving.discard(req.id)
            live.engine_worker = dst.id
            done(arg)

        def exported(f) -> None:  # on the source backend's thread
            if f.exception() is not None:
                self.loop.soon(self._transfer_failed, live, src, dst, f.exception(), src)
                return
            handle = f.result()

            def after_import(g) -> None:  # on the destination backend's thread
                if isinstance(g.exception(), WorkerError):  # it died holding nothing: free the segment here
                    _release_quietly(handle)
                self.loop.soon(imported, g)

            self.backends[dst.id].submit("import_kv", handle, None, live.engine_id).add_done_callback(after_import)

        via = self.transport_between(src.id, dst.id)
        self.backends[src.id].submit("export_kv", live.engine_id, True, via).add_done_callback(exported)

    def transport_between(self, src: int, dst: int) -> str | None:
        """The KV transport from worker `src` to `dst`: the object store between nodes of a Ray
        cluster, else (None) the workers' own (shared memory on one machine)."""
        a, b = (getattr(self.backends[i], "node_id", None) for i in (src, dst))
        return "ray" if a is not None and b is not None and a != b else None

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
        self.moving.discard(req.id)
        self.schedule(src)
        self.schedule(dst)
        if isinstance(exc, WorkerError):  # a worker died, not the request: it starts over
            if req.id in self.live:
                self.restart(req)
            self.worker_down(side.id, f"{type(exc).__name__}: {exc}")
            return
        self.fail(req, f"moving its KV from worker {src.id} to worker {dst.id} failed (see the server log)")

    def run_phase(self, a: RunPhase, kv_blocks: int) -> None:
        if a.phase == "restart":
            raise RuntimeError("the runtime changes roles in place (FluidRole); it does not model restarts")
        if a.phase != "remap":
            self.loop.soon(self.phase_end, a)
            return
        backend = self.backends[a.worker]
        self.remaps[a.worker] = self.now
        fut = backend.submit("resize_kv", kv_blocks)
        fut.add_done_callback(lambda f: self.loop.soon(self._remapped, a, backend, f))

    def _remapped(self, a: RunPhase, backend, fut) -> None:
        if self.backends[a.worker] is not backend or a.worker in self.down:
            return  # the worker was lost meanwhile (its transition abandoned)
        self.remaps.pop(a.worker, None)
        exc = fut.exception()
        if exc is not None:
            self.worker_down(a.worker, f"resize_kv failed: {type(exc).__name__}: {exc}", kill=True)
            return
        self.phase_end(a)


def _release_quietly(handle) -> None:
    """Free an exported KV handle no engine will import (its importer died)."""
    from fluidpd.runtime.transport import release

    try:
        release(handle)
    except Exception as exc:  # noqa: BLE001 - already freed by the importer before it died
        log.debug("releasing KV handle %r: %s", handle, exc)
