"""Worker loss and replacement for the runtime cluster.

A worker that dies (its process exits, a call fails with WorkerError) or hangs (a heartbeat, which
a worker answers beside a step in progress, or a step or a remap unanswered past its timeout) is
lost: its requests start over on the others from their prompt plus the tokens already streamed
(`World.lose_worker`), so each stream goes on with no token lost or repeated; a replacement engine
starts in the background and joins in the role the policy wants; until then the cluster serves
smaller. A request whose prefill was in MAX_STEP_TIMEOUTS steps that ran over the step timeout fails
visibly instead of starting over: one request must not take worker after worker down.
"""

from __future__ import annotations

import logging
import threading
import time

from fluidpd.core.request import Request
from fluidpd.runtime import groups
from fluidpd.world.events import EventKind

log = logging.getLogger("fluidpd.runtime")
WATCH_S = 0.25  # how often process exits and heartbeats are checked
REPLACE_ATTEMPTS = 3
MAX_STEP_TIMEOUTS = 2  # a request prefilled in this many steps that ran over the timeout fails


class WorkerRecovery:
    """RuntimeCluster's watch over its workers: a lost one's requests restart elsewhere, a replacement starts."""

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
                for rid in self.step_prefills.get(wid, ()):
                    if (live := self.live.get(rid)) is not None:
                        live.step_timeouts += 1
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
        self.step_prefills.pop(wid, None)
        self.remaps.pop(wid, None)
        self.losses.append({"worker": wid, "at_s": self.now, "reason": why, "restarted": len(restarted)})
        log.error("worker %d lost (%s); %d requests start over on the others", wid, why, len(restarted))
        if self.spawn is not None:
            self._replace(wid)

    def restart(self, req: Request) -> None:
        live = self.live.get(req.id)
        if live is not None:
            live.engine_worker = -1  # its engine (and KV) are gone: the next admission recomputes
            if live.step_timeouts >= MAX_STEP_TIMEOUTS:
                log.error(
                    "request %s failed: its prefill ran over the step timeout %d times", req.id, live.step_timeouts
                )
                self.fail(req, f"its prefill ran over the step timeout on {live.step_timeouts} workers")
                return
        groups.restarting(req)
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
