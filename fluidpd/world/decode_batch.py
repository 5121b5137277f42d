"""A worker's decode batch, accounted lazily: each step's KV growth and each request's tokens."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fluidpd.core.request import Request
from fluidpd.policy.view import blocks_for


class DecodeBatch:
    """Base of WorkerState: the requests decoding on a worker, in O(1)-per-step bookkeeping.

    Decode-side KV growth is tracked without touching every request: a decoding request with
    `s0` stored tokens that joined after decode step `k0` needs a new block at every step `k`
    with k = k0 + 1 - s0 (mod block_size), so one counter per residue gives each step's need.

    Token counts are lazy the same way: a decoding request's `generated` is brought up to date
    (`sync`) only when it leaves or is read through this worker, from the decode steps since it was
    last synced; the requests that reach their output length at step k wait in `finishing[k]`.
    """

    __slots__ = (
        "buckets",
        "decode_ctx_sum",
        "decode_masked",
        "decode_rows",
        "decode_steps",
        "decoding",
        "finishing",
        "incoming",
        "joiners",
        "last_decode_end",
        "marks",
        "over_cum",
        "synced",
        "tokens_out",
    )

    if TYPE_CHECKING:  # what WorkerState provides
        id: int
        block_size: int
        busy: bool
        held: dict[int, Request]

        @staticmethod
        def stored(req: Request) -> int: ...
        def free(self, blocks: int) -> None: ...

    def init_decode_batch(self, block_size: int) -> None:
        self.decoding: dict[int, Request] = {}
        self.decode_ctx_sum = 0  # stored KV tokens over decoding sequences
        self.decode_rows = 0  # sequences decoding (a request group counts its live ones): the batch size
        self.decode_masked = 0  # of those, rows a grammar masks (structured outputs)
        self.decode_steps = 0
        self.over_cum = 0  # decode steps whose gap exceeded SLO_TBT
        self.last_decode_end = math.nan
        self.joiners: list[Request] = []
        self.incoming: list[Request] = []  # KV arrived during a step: joins when it ends
        self.marks: dict[int, tuple[int, int, int]] = {}  # id -> (decode_steps, over_cum, bucket)
        self.buckets = [0] * block_size
        self.synced: dict[int, tuple[int, int]] = {}  # id -> (decode step `generated` is of, final step)
        self.finishing: dict[int, dict[int, Request]] = {}  # final step -> its requests, in join order
        self.tokens_out = 0  # tokens generated here (first tokens out of prefill included)

    def join(self, req: Request) -> None:
        """Start decoding `req`, whose KV (all `stored` tokens) is already on this worker."""
        if self.busy:
            self.incoming.append(req)
            req.worker = self.id
            return
        s0 = self.stored(req)
        bucket = (self.decode_steps + 1 - s0) % self.block_size
        self.decoding[req.id] = req
        self.decode_ctx_sum += req.live * s0
        self.decode_rows += req.live
        self.decode_masked += req.live if req.constrained else 0
        self.buckets[bucket] += req.live
        self.marks[req.id] = (-1, 0, bucket)
        end = self.decode_steps + max(1, req.output_len - req.generated)
        self.synced[req.id] = (self.decode_steps, end)
        self.finishing.setdefault(end, {})[req.id] = req
        self.joiners.append(req)
        req.worker = self.id

    def leave(self, req: Request) -> None:
        """Stop decoding `req` here, closing its gap accounting; its KV blocks stay allocated."""
        del self.decoding[req.id]
        self.sync(req)
        end = self.synced.pop(req.id)[1]
        finishing = self.finishing.get(end)
        if finishing is not None:  # (None: it left at the step it finished)
            del finishing[req.id]
            if not finishing:
                del self.finishing[end]
        steps, over, bucket = self.marks.pop(req.id)
        self.buckets[bucket] -= req.live
        self.decode_rows -= req.live
        self.decode_masked -= req.live if req.constrained else 0
        self.decode_ctx_sum -= req.live * self.stored(req)
        if steps < 0:
            self.joiners.remove(req)
        else:
            req.add_gaps(self.decode_steps - steps, self.over_cum - over)
            req.last_token_s = self.last_decode_end

    def drop_sequence(self, req: Request) -> None:
        """One sequence of group `req` (its KV here) stopped before the others: its own blocks are freed,
        the decode batch shrinks (the engine said so: the simulator runs every sequence to its length)."""
        if req.live <= 1:
            raise ValueError(f"request {req.id}: its last sequence ends the request (finish it)")
        if req.id in self.decoding:
            self.shrink(req)
            stored = self.stored(req) + 1  # the step in flight holds its last token's KV
        elif req.prefilled < req.prefill_target:  # in the step of its last chunk (that sampled)
            stored = req.prompt_len + req.generated
        else:
            stored = self.stored(req)
        self.free(blocks_for(stored, self.block_size) - req.prompt_len // self.block_size)
        req.live -= 1

    def shrink(self, req: Request) -> None:
        """One sequence of decoding group `req` stopped (the caller then lowers `req.live`)."""
        self.sync(req)
        self.buckets[self.marks[req.id][2]] -= 1
        self.decode_rows -= 1
        self.decode_masked -= 1 if req.constrained else 0
        self.decode_ctx_sum -= self.stored(req)

    def sync(self, req: Request) -> None:
        """Bring decoding `req`'s `generated` up to date: one token per decode step since last synced."""
        step, end = self.synced[req.id]
        req.generated += self.decode_steps - step
        self.synced[req.id] = (self.decode_steps, end)

    def sync_decoding(self) -> None:
        """Bring every decoding request's `generated` up to date (before reading their counts)."""
        for req in self.decoding.values():
            self.sync(req)

    def join_incoming(self) -> None:
        incoming, self.incoming = self.incoming, []
        for req in incoming:
            self.join(req)

    def growth_blocks(self) -> int:
        """New KV blocks the next decode step needs."""
        return self.buckets[(self.decode_steps + 1) % self.block_size]

    def preemption_victim(self) -> Request:
        """The latest-arrived decoding request (vLLM's recompute preemption order)."""
        return max(self.decoding.values(), key=lambda r: (r.arrival_s, r.id))

    def decode_tick(self, now: float, slo_tbt_s: float, on_gap, stopped: frozenset = frozenset()) -> list[Request]:
        """Account one finished decode step at `now`; returns the requests that finished (reached
        their output length, or are in `stopped`: ended early by the engine)."""
        self.decode_steps += 1
        rows = self.decode_rows
        self.decode_ctx_sum += rows
        joiners = self.joiners
        continuing = len(self.decoding) - len(joiners)
        if continuing:
            gap = now - self.last_decode_end
            on_gap(gap, continuing)
            if gap > slo_tbt_s:
                self.over_cum += 1
        if joiners:
            mark = (self.decode_steps, self.over_cum)
            for req in joiners:
                gap = now - req.last_token_s
                on_gap(gap, 1, req.moved)
                req.moved = False
                req.add_gap(gap, slo_tbt_s)
                self.marks[req.id] = (*mark, self.marks[req.id][2])
            self.joiners = []
        self.last_decode_end = now
        finishing = self.finishing.pop(self.decode_steps, None)
        if stopped:  # in batch order, like the requests that reached their length
            done = [r for r in self.decoding.values() if r.id in stopped or (finishing and r.id in finishing)]
        elif finishing is None:
            done = []
        else:
            done = list(finishing.values())
        for req in done:
            self.sync(req)
        self.tokens_out += rows
        return done
