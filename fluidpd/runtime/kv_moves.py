"""KV moves and phases for the runtime cluster: export on one engine, import on another; remap by `resize_kv`."""

from __future__ import annotations

import logging

from fluidpd.engine.block_pool import MissingCachedBlocks
from fluidpd.policy.actions import RunPhase
from fluidpd.runtime.live import Live
from fluidpd.runtime.messages import WorkerError
from fluidpd.world.worker import WorkerState

log = logging.getLogger("fluidpd.runtime")


class KVMoves:
    """RuntimeCluster's KV hand-offs and migrations between engines, and FluidRole's remap of one engine's arena."""

    def transfer(
        self, req, src: WorkerState, dst: WorkerState, tokens: int, cls: str, done, arg, skip_blocks: int = 0
    ) -> None:
        """Copy `req`'s KV from `src` to `dst`, less the `skip_blocks` leading blocks `dst` holds
        cached (in this view); once `dst` holds it, `src` drops it (its blocks stay cached there).
        If `dst`'s engine no longer holds the skipped blocks (evicted since this view was taken),
        the whole KV is sent instead: one fallback, counted in `kv_move_fallbacks`."""
        live = self.live[req.id]
        self.moving.add(req.id)

        def imported(f, skip: int, nbytes: int) -> None:  # on the loop
            self.kv_bytes_sent += nbytes
            exc = f.exception()
            if isinstance(exc, MissingCachedBlocks) and skip and self.workers[dst.id] is dst:
                log.info("request %d: worker %d lacks its %d cached KV blocks; sending them all", req.id, dst.id, skip)
                self.kv_move_fallbacks += 1
                self.kv_tokens_moved += skip * dst.block_size
                send(0)
                return
            if exc is not None:
                self._transfer_failed(live, src, dst, exc, dst)
                return
            if self.workers[dst.id] is not dst:  # the destination died after the import
                self._transfer_failed(live, src, dst, WorkerError(f"worker {dst.id} was lost"), dst)
                return
            self.moving.discard(req.id)
            self.backends[src.id].submit("abort", live.engine_id)  # before any later call on src: its KV is freed
            live.engine_worker = dst.id
            done(arg)

        def send(skip: int) -> None:
            def exported(f) -> None:  # on the source backend's thread
                if f.exception() is not None:
                    self.loop.soon(self._transfer_failed, live, src, dst, f.exception(), src)
                    return
                handle = f.result()

                def after_import(g) -> None:  # on the destination backend's thread
                    if isinstance(g.exception(), WorkerError):  # it died holding nothing: free the segment here
                        _release_quietly(handle)
                    self.loop.soon(imported, g, skip, handle.nbytes)

                self.backends[dst.id].submit("import_kv", handle, None, live.engine_id).add_done_callback(after_import)

            via = self.transport_between(src.id, dst.id)
            fut = self.backends[src.id].submit("export_kv", live.engine_id, False, via, skip)
            fut.add_done_callback(exported)

        send(skip_blocks)

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
        if side is not src:  # the source's engine still holds the request (exported without release)
            self.backends[src.id].submit("abort", live.engine_id)
            live.engine_worker = -1
        src.held.pop(req.id, None)
        src.release(req)
        dst.release(req, tokens=0)  # its KV never arrived: nothing of it is cached there
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
