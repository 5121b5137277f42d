"""How a world carries out the control plane's elastic actions."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from fluidpd.core.piece import PrefillPiece, split_prompt
from fluidpd.core.request import Request
from fluidpd.policy.actions import Borrow, BorrowSplit, Migrate, ResumeRouting, RunPhase, StopRouting
from fluidpd.policy.view import Role, blocks_for
from fluidpd.world.links import HANDOFF, MIGRATION

if TYPE_CHECKING:
    from fluidpd.policy.base import Policy
    from fluidpd.world.trace import RequestTracer
    from fluidpd.world.worker import WorkerState


@dataclass(slots=True)
class Spread:
    """A request prefilled as pieces on several workers, gathered to `home` to decode."""

    request: Request
    home: int
    pieces: list
    unfinished: int
    in_flight: int = 0


class Elastic:
    """Mixin of World: Borrow, BorrowSplit, StopRouting, ResumeRouting, Migrate and the FluidRole phases."""

    if TYPE_CHECKING:  # what World provides
        policy: Policy
        loop: Any
        workers: list[WorkerState]
        spreads: dict[int, Spread]
        prefill_kv_fraction: float
        prefill_kv_floor: int
        hold_first_token: bool
        tracer: RequestTracer | None
        parked_handoffs: deque
        down: set[int]

        @property
        def now(self) -> float: ...
        def schedule(self, w: WorkerState) -> None: ...
        def submit(self, req: Request, front: bool = False, in_order: bool = False) -> None: ...
        def finish(self, req: Request) -> None: ...
        def decode_or_hand_off(self, w: WorkerState, req: Request) -> None: ...
        def start_pulls(self, d: WorkerState) -> None: ...
        def unpark(self) -> None: ...
        def transfer(
            self, req, src: WorkerState, dst: WorkerState, tokens: int, cls: str, done, arg, skip_blocks: int = 0
        ) -> None: ...
        def move_kv(self, req: Request, src: WorkerState, dst: WorkerState, need: int, cls: str, done) -> None: ...
        def hand_off(self, req: Request) -> None: ...

    def apply(self, actions: list) -> None:
        for action in actions:
            handler = self._handlers[type(action)]
            handler(self, action)

    def _borrow(self, a: Borrow) -> None:
        src, dst = self.workers[a.src], self.workers[a.dst]
        req = a.request
        if req.worker >= 0 or req not in src.queue or not dst.routable:
            return  # stale: the prefill worker already started it
        src.dequeue(req)
        req.borrowed = True
        dst.enqueue(req)
        if self.tracer:
            self.tracer.mark(req, "borrowed", self.loop.now, dst.id, **{"from": src.id})
        self.schedule(dst)

    def _borrow_split(self, a: BorrowSplit) -> None:
        src, home = self.workers[a.src], self.workers[a.dsts[0]]
        req = a.request
        if req.worker >= 0 or req not in src.queue or not home.routable:
            return
        pieces = split_prompt(req, len(a.dsts))
        reserve = blocks_for(req.prompt_len, home.block_size) - blocks_for(pieces[0].length, home.block_size)
        if reserve > home.free_blocks:
            return
        src.dequeue(req)
        req.borrowed = True
        home.allocate(reserve)
        self.spreads[req.id] = Spread(req, home.id, pieces, len(pieces))
        for piece, dst in zip(pieces, a.dsts):
            self.workers[dst].enqueue(piece)
            self.schedule(self.workers[dst])

    def piece_done(self, w, piece: PrefillPiece) -> None:
        """One piece finished on `w`; the last one emits the first token and starts the gather."""
        spread = self.spreads[piece.id]
        spread.unfinished -= 1
        if spread.unfinished:
            return
        req, home = spread.request, self.workers[spread.home]
        req.prefilled = req.prefill_target
        req.emit(self.loop.now)
        w.tokens_out += req.live
        for p in spread.pieces[1:]:  # piece 0 ran at home; the reservation holds the rest
            src = self.workers[p.worker]
            if src is home:
                src.free(blocks_for(p.length, src.block_size))
                continue
            spread.in_flight += 1
            src.transfers_out += 1
            home.transfers_in += 1
            self.transfer(p, src, home, p.length, HANDOFF, self._gathered, (spread, p, src))
        if spread.in_flight:  # like a hand-off's, its first token goes out with the first decode step
            req.held_first = self.hold_first_token
        else:
            self._spread_done(spread)

    def _gathered(self, arg) -> None:
        spread, piece, src = arg
        home = self.workers[spread.home]
        src.free(blocks_for(piece.length, src.block_size))
        src.transfers_out -= 1
        home.transfers_in -= 1
        spread.in_flight -= 1
        self.schedule(src)
        if not spread.in_flight:
            self._spread_done(spread)

    def _spread_done(self, spread: Spread) -> None:
        """All KV is home (blocks_for(prompt) there): decode the request, or finish it."""
        del self.spreads[spread.request.id]
        req, home = spread.request, self.workers[spread.home]
        req.worker = home.id
        if req.finished:
            home.release(req)
            self.finish(req)
            return
        req.moved = len(spread.pieces) > 1
        self.decode_or_hand_off(home, req)  # home may have changed role since the spread began
        self.schedule(home)

    def _stop_routing(self, a: StopRouting) -> None:
        w = self.workers[a.worker]
        w.routable = False
        self._trace_switch(w)
        for req in [r for r in w.queue if r.worker < 0 and not isinstance(r, PrefillPiece)]:
            w.dequeue(req)
            self.submit(req, in_order=True)  # a drained queue keeps its place among the peer's
        while w.pulls:
            req = w.pulls.popleft()
            w.pull_blocks_pending -= w.blocks_of(req)
            self.hand_off(req)

    def _resume_routing(self, a: ResumeRouting) -> None:
        if a.worker in self.down:
            return
        w = self.workers[a.worker]
        w.routable = True
        w.role_since = self.loop.now  # residence: the rolled-back worker is not picked again at once
        self.unpark()
        self.schedule(w)

    def _migrate(self, a: Migrate) -> None:
        src, dst, req = self.workers[a.src], self.workers[a.dst], a.request
        if src.busy:
            src.deferred.append(a)  # the step in flight still emits this request's token
            return
        if req.id not in src.decoding:
            return
        need = src.blocks_of(req)
        if need > dst.free_blocks:
            return  # the peer filled up meanwhile: the drain asks again
        src.leave(req)
        src.transfers_out += 1
        dst.transfers_in += 1
        self.move_kv(req, src, dst, need, MIGRATION, self._migrated)

    def _migrated(self, arg) -> None:
        req, src, dst = arg
        src.release(req)
        dst.register(req, dst.stored(req))
        src.transfers_out -= 1
        dst.transfers_in -= 1
        req.migrations += 1
        req.moved = True
        if self.tracer:
            self.tracer.transfer_done(req, self.loop.now)
        dst.join(req)
        self.schedule(dst)
        self.schedule(src)

    def _run_phase(self, a: RunPhase) -> None:
        self.run_phase(a, self.remap_blocks(self.workers[a.worker], a.role))

    def run_phase(self, a: RunPhase, kv_blocks: int) -> None:
        """World-specific: carry out phase `a` (remap: re-slice to `kv_blocks`), then `phase_end(a)`."""
        raise NotImplementedError

    def remap_blocks(self, w, role: Role) -> int:
        """KV blocks a worker keeps in `role` (a prefill worker may give part of its arena to scratch)."""
        if role is Role.PREFILL:
            target = min(w.kv_blocks_full, max(self.prefill_kv_floor, int(w.kv_blocks_full * self.prefill_kv_fraction)))
        else:
            target = w.kv_blocks_full
        if target < w.kv_blocks_used:  # cached blocks do not count: a shrink evicts them
            raise RuntimeError(f"worker {w.id}: remap below live KV ({w.kv_blocks_used} blocks)")
        return target

    def phase_end(self, a: RunPhase) -> None:
        t = self.policy.transition_of(a.worker)
        if t is None or not t.expects(a):  # stale: the worker was lost mid-switch (abandoned)
            return
        w = self.workers[a.worker]
        if a.phase in ("remap", "restart"):  # a restart comes back re-sliced and in its new role
            w.resize(self.remap_blocks(w, a.role))  # cached blocks go first; what fits stays
        if a.phase in ("dispatch", "restart"):
            self._trace_switch(w)
            w.role = a.role
            if a.role is Role.DECODE:
                self._adopt_held(w)
        if a.phase == "route":
            w.routable = True
            w.role_since = self.loop.now
            self.unpark()
        self.apply(self.policy.on_phase_done(w.id, a.phase, self.loop.now))
        self.schedule(w)

    def _trace_switch(self, w) -> None:
        t = self.policy.transition_of(w.id)
        if self.tracer and t is not None:
            on_w = [*w.queue, *w.decoding.values(), *w.held.values(), *w.pulls, *w.incoming]
            self.tracer.role_switch([r for r in on_w if isinstance(r, Request)], w, t, self.loop.now)

    def _adopt_held(self, w) -> None:
        """A former prefill worker decodes the KV it still holds instead of shipping it."""
        for d in self.workers:
            for req in [r for r in d.pulls if r.worker == w.id]:
                d.pulls.remove(req)
                d.pull_blocks_pending -= d.blocks_of(req)
                del w.held[req.id]
                w.join(req)
        for req in [r for r in self.parked_handoffs if r.worker == w.id]:
            self.parked_handoffs.remove(req)
            del w.held[req.id]
            w.join(req)

    _handlers: ClassVar[dict[type, Callable[[Elastic, Any], None]]] = {
        Borrow: _borrow,
        BorrowSplit: _borrow_split,
        StopRouting: _stop_routing,
        ResumeRouting: _resume_routing,
        Migrate: _migrate,
        RunPhase: _run_phase,
    }
