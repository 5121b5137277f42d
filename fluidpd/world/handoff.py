"""The pull-based KV hand-off: a prefilled request's KV waits on its prefill worker until a decode worker pulls it."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from fluidpd.core.request import Request
from fluidpd.policy.routing import NoRoutableWorker
from fluidpd.world.links import HANDOFF
from fluidpd.world.worker import WorkerState

if TYPE_CHECKING:
    from fluidpd.policy.base import Policy
    from fluidpd.world.trace import RequestTracer


class Handoff:
    """Mixin of World: where a prefilled request decodes; decode workers pull held KV, FCFS, while they have room."""

    if TYPE_CHECKING:  # what World provides
        policy: Policy
        loop: Any
        workers: list[WorkerState]
        tracer: RequestTracer | None
        parked_handoffs: deque
        hold_first_token: bool
        kv_tokens_moved: int

        @property
        def now(self) -> float: ...
        def schedule(self, w: WorkerState) -> None: ...
        def finish(self, req: Request) -> None: ...
        def reject(self, req: Request) -> None: ...
        def kv_bytes(self, tokens: int) -> float: ...
        def transfer(
            self, req, src: WorkerState, dst: WorkerState, tokens: int, cls: str, done, arg, skip_blocks: int = 0
        ) -> None: ...

    def decode_or_hand_off(self, w: WorkerState, req: Request) -> None:
        """`req`'s KV is on `w`: decode it there, or hold it there for a decode worker to pull."""
        try:
            dst = self.policy.handoff(req, w, self)
        except NoRoutableWorker:
            dst = -1
        if dst is None or dst == w.id:
            w.join(req)
            return
        w.held[req.id] = req
        req.worker = w.id
        req.held_first = self.hold_first_token and req.generated == 1
        if dst < 0:
            self.parked_handoffs.append(req)
            return
        self.pull(req, dst)

    def hand_off(self, req: Request) -> None:
        """Queue the pull of `req`'s KV (held on worker `req.worker`) on a routable decode worker."""
        src = self.workers[req.worker]
        try:
            dst = self.policy.handoff(req, src, self)
        except NoRoutableWorker:
            self.parked_handoffs.append(req)
            return
        if dst is None or dst == src.id:
            del src.held[req.id]
            src.join(req)
            self.schedule(src)
            return
        self.pull(req, dst)

    def pull(self, req: Request, dst: int) -> None:
        """Decode worker `dst` will fetch `req`'s KV (FCFS, when it has room)."""
        d = self.workers[dst]
        d.pulls.append(req)
        d.pull_blocks_pending += d.blocks_of(req)
        self.start_pulls(d)

    def start_pulls(self, d: WorkerState) -> None:
        """A decode worker fetches queued KV, FCFS, while its memory and batch have room."""
        limit = self.policy.config.max_num_seqs
        while d.pulls:
            req = d.pulls[0]
            need = d.blocks_of(req)
            if need > d.free_blocks or (d.decode_rows and d.decode_rows + req.live > limit):
                return
            d.pulls.popleft()
            d.pull_blocks_pending -= need
            if req.worker < 0:  # arrived prefilled: nothing to move
                d.allocate(need)
                d.join(req)
                self.schedule(d)
                continue
            src = self.workers[req.worker]
            src.transfers_out += 1
            d.transfers_in += 1
            self.move_kv(req, src, d, need, HANDOFF, self._pulled)

    def move_kv(self, req: Request, src: WorkerState, dst: WorkerState, need: int, cls: str, done) -> None:
        """Move `req`'s stored KV (`need` blocks) from `src` to `dst`: only the blocks `dst` does not
        hold cached already travel; `dst` holds those it has and allocates the rest."""
        skip = dst.take_moved(req)
        dst.allocate(need - skip)
        tokens = WorkerState.stored(req) - skip * dst.block_size
        self.kv_tokens_moved += tokens
        if self.tracer:
            self.tracer.transfer_started(req, src, dst, tokens, self.kv_bytes(tokens), cls, self.loop.now)
        self.transfer(req, src, dst, tokens, cls, done, (req, src, dst), skip)

    def _pulled(self, arg: tuple[Request, WorkerState, WorkerState]) -> None:
        req, src, d = arg
        del src.held[req.id]
        src.release(req, moved=self.policy.follows_kv)  # the source keeps the prompt cached
        d.register(req, WorkerState.stored(req))  # arrived KV is cached on the decode worker
        src.transfers_out -= 1
        d.transfers_in -= 1
        req.moved = True
        if self.tracer:
            self.tracer.transfer_done(req, self.loop.now)
        d.join(req)
        self.schedule(d)
        self.schedule(src)

    def _arrive_prefilled(self, req: Request) -> None:
        """The decode phase alone: the prompt's KV is in place and its first token out; the request
        waits for decode room like a pulled hand-off (with nothing to transfer)."""
        d = self.workers[self.policy.route(req, self)]
        if d.group_blocks(req, req.prompt_len + req.output_len) > d.kv_blocks_full:
            self.reject(req)
            return
        req.prefilled = req.prefill_target
        req.emit(self.loop.now)
        if req.finished:
            self.finish(req)
            return
        d.pulls.append(req)
        d.pull_blocks_pending += d.blocks_of(req)
        self.start_pulls(d)
