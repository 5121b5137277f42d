"""A worker lost with its KV, and its return: the lifecycle's side of fault tolerance.

  lose_worker(w):  every request with work or KV on w starts over elsewhere from its prompt plus
                   the tokens already out (a recompute, as after a preemption: nothing lost or
                   repeated); the pulls w had queued go to another decode worker; w gets a fresh,
                   unroutable state and the policy abandons whatever it was doing with it.
  rejoin_worker(w): a replacement engine is up: w comes back empty, in the role the policy wants.
  park / unpark:   a request (or a prefilled hand-off) that has no routable worker of the role it
                   needs waits, instead of failing, until one is routable again.
A request whose KV is in flight between workers (`moving`) is left to its transfer's outcome.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from fluidpd.core.request import Request
from fluidpd.policy.view import Role
from fluidpd.world.worker import WorkerState

if TYPE_CHECKING:
    from fluidpd.policy.base import Policy
    from fluidpd.world.trace import RequestTracer


class Recovery:
    """Mixin of World: lose a worker, restart its requests elsewhere, park what has nowhere to go."""

    if TYPE_CHECKING:  # what World provides
        policy: Policy
        loop: Any
        workers: list[WorkerState]
        tracer: RequestTracer | None

        @property
        def now(self) -> float: ...
        def submit(self, req: Request, front: bool = False, in_order: bool = False) -> None: ...
        def schedule(self, w: WorkerState) -> None: ...
        def start_pulls(self, d: WorkerState) -> None: ...
        def hand_off(self, req: Request) -> None: ...
        def remap_blocks(self, w, role: Role) -> int: ...
        def apply(self, actions: list) -> None: ...

    def init_recovery(self) -> None:
        self.down: set[int] = set()  # workers lost and not yet replaced
        self.moving: set[int] = set()  # requests whose KV is in flight between workers
        self.parked: deque[Request] = deque()  # no routable worker to prefill them
        self.parked_handoffs: deque[Request] = deque()  # prefilled; no routable decode worker

    def lose_worker(self, wid: int) -> list[Request]:
        """`wid` is gone with its KV; returns the requests that start over."""
        if wid in self.down:
            return []
        self.down.add(wid)
        w = self.workers[wid]
        for d in self.workers:  # KV that was to be pulled from w is gone
            for req in [r for r in d.pulls if r.worker == wid and r.id not in self.moving]:
                d.pulls.remove(req)
                d.pull_blocks_pending -= d.blocks_of(req)
        w.sync_decoding()  # they restart from the tokens already out
        lost = [*w.held.values(), *w.decoding.values(), *w.incoming]
        lost += [r for r in w.queue if isinstance(r, Request)]
        waiting = [r for r in w.pulls if r.id not in self.moving]  # their KV is elsewhere, alive
        self.parked_handoffs = deque(r for r in self.parked_handoffs if r.worker != wid)
        fresh = WorkerState(wid, w.role, w.node, w.kv_blocks_full, w.block_size)
        fresh.host = w.host.fresh() if w.host is not None else None
        fresh.kv_blocks_total, fresh.routable = w.kv_blocks_total, False
        self.workers[wid] = fresh
        self.apply(self.policy.worker_lost(wid, self))
        for req in waiting:
            self.hand_off(req)
        restarted = sorted({r.id: r for r in lost if r.id not in self.moving}.values(), key=lambda r: r.arrival_s)
        for req in restarted:
            self.restart(req)
        return restarted

    def restart(self, req: Request) -> None:
        """`req` starts over from its prompt plus the tokens already out (its KV is gone)."""
        if self.tracer:
            self.tracer.mark(req, "restarted", self.now, req.worker)
        req.start_over()
        req.moved = False
        self.submit(req, in_order=True)

    def rejoin_worker(self, wid: int, role: Role) -> WorkerState:
        """A replacement engine for `wid` is up (its arena sized for `role`): it serves again, empty."""
        old = self.workers[wid]
        w = WorkerState(wid, role, old.node, old.kv_blocks_full, old.block_size)
        w.host = old.host.fresh() if old.host is not None else None
        w.kv_blocks_total = self.remap_blocks(w, role)
        w.role_since = self.loop.now
        self.workers[wid] = w
        self.down.discard(wid)
        self.unpark()
        self.schedule(w)
        return w

    def unpark(self) -> None:
        """Give parked requests and hand-offs another try (a worker became routable)."""
        requests, self.parked = self.parked, deque()
        for req in requests:
            self.submit(req, in_order=True)
        handoffs, self.parked_handoffs = self.parked_handoffs, deque()
        for req in handoffs:
            self.hand_off(req)
