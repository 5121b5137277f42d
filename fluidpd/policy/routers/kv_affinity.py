"""FluidPD's KV-affinity routing: every candidate priced by the TTFT it predicts, from the cache.

A new request's decode worker is chosen first: the one holding most of its context (its session's
previous turn decoded there) among those with KV room and TBT slack, when it holds at least half the
prompt more than the least-loaded one does; else the least loaded (most free KV). Then each
candidate's predicted time to first token, at measured speeds:
  prefill worker p:  its queue's uncached prefill work + this request's uncached prefill on p
                     (f_P of its new tokens plus their attention over the cached prefix)
                     + moving the KV the decode worker lacks over the link
  the decode worker: FluidToken chunks within its TBT slack (no transfer): its queue's uncached
                     tokens, then this request's, in steps of the chunk its slack fits, each step its
                     decode time plus the chunk's marginal cost; the request's own chunks attend
                     to every token before them, so they shrink and cost more as its prompt grows
The least wins (the decode worker on a tie), the decode worker only when it holds at least as much of
the request as every prefill worker (its KV is the reason to go there; a queue that merely runs long
is FluidToken borrowing's to relieve, as PPI says). A hot prefix whose holder's queue costs more than
recomputing it elsewhere goes elsewhere (and is cached there next), so load spreads without a
per-workload weight. One decision reads each candidate's cache once: O(workers x matched blocks).
A hit in a worker's host tier counts only if loading it back is faster than recomputing it (a slow
tier must not lose to recompute), and its load time is added to that candidate's predicted TTFT.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fluidpd.core.request import Request
from fluidpd.policy.fluidtoken import FluidToken
from fluidpd.policy.routing import candidates, most_room
from fluidpd.policy.view import ClusterView, Role, WorkerView, blocks_for

KV_AFFINITY = "kv-affinity"


class KvAffinity:
    """Predicted-TTFT routing over prefill workers and the decode worker that holds the context."""

    name = KV_AFFINITY
    imitates = "FluidPD: predicted TTFT from uncached prefill, queue and KV moves"

    def __init__(
        self,
        prefill_work: Callable[[float], float],
        batch_tokens: Callable[[], int],
        token: FluidToken,
        move_s_per_token: float = 0.0,
        load_s_per_token: float = 0.0,
    ):
        self.prefill_work = prefill_work  # f_P as this world runs it
        self.batch_tokens = batch_tokens  # L_m: a prefill worker's batch (its throughput point)
        self.token = token
        self.move_s_per_token = move_s_per_token
        self.load_s_per_token = load_s_per_token  # loading one token's KV from the host tier
        self.on_decode = 0  # requests routed to prefill on their decode worker

    def hit(self, w: WorkerView, req: Request) -> tuple[int, float]:
        """(tokens of `req` cached on `w`, seconds to load the host tier's part of them): the host
        tier's blocks count only where loading them beats recomputing them."""
        device, host = w.cached_blocks(req)
        if not host:
            return w.cached_tokens(req, (device, host)), 0.0  # the prefix matched once
        tokens = host * w.block_size
        load_s = tokens * self.load_s_per_token
        if load_s >= self.prefill_work(tokens):
            return device * w.block_size, 0.0
        return (device + host) * w.block_size, load_s

    def decode_for(
        self, req: Request, view: ClusterView, hits: dict[int, int] | None = None, loads: dict | None = None
    ) -> WorkerView:
        """The decode worker for `req`: the least loaded (most free KV, static-pd's rule), unless another
        with room and slack holds most of its context that one lacks (a session's; a prefix every
        worker shares is no reason to load one more). `hits`, `loads`: filled with the cached tokens of
        `req` on each worker holding some, and the seconds loading them from its host tier takes (a
        worker not there holds none)."""
        hits = {} if hits is None else hits
        loads = {} if loads is None else loads
        pool = candidates(view.workers, Role.DECODE)
        need = blocks_for(req.prompt_len + req.output_len, pool[0].block_size)
        best, best_key = None, (0, 0)
        for w in pool if req.block_hashes else ():  # (no block ids: nothing is cached anywhere)
            hit, loads[w.id] = self.hit(w, req)
            hits[w.id] = hit
            blocks = hit // w.block_size
            room = w.free_blocks - w.pull_blocks_pending
            if blocks and room >= need - blocks and (blocks, room) > best_key and self.token.slack(w) > 0:
                best, best_key = w, (blocks, room)
        least = most_room(pool)
        if best is not None and 2 * (hits[best.id] - hits.get(least.id, 0)) >= req.prompt_len:
            return best
        return least

    def route(self, req: Request, view: ClusterView) -> int:
        hits: dict[int, int] = {}
        loads: dict[int, float] = {}
        d = self.decode_for(req, view, hits, loads)
        move_s = self.move_s_per_token * (req.prompt_len - hits.get(d.id, 0))
        best, best_s, most = -1, math.inf, 0
        pair_s, target, hashed = self.token.attn_pair_s, req.prefill_target, bool(req.block_hashes)
        b = max(1, self.batch_tokens())
        batch_s, uncached_s = self.prefill_work(b), self.prefill_work(target)  # (`queue_s`'s, hoisted)
        for p in candidates(view.workers, Role.PREFILL):
            hit, load_s = self.hit(p, req) if hashed else (0, 0.0)
            most = max(most, hit)
            new = target - hit
            q = p.queued_uncached
            work = self.prefill_work(new) if hit else uncached_s
            t = (q * batch_s / b if q else 0.0) + load_s + work + pair_s * new * hit + move_s
            if t < best_s:
                best, best_s = p.id, t
        d_hit = hits.get(d.id, 0)
        if d_hit >= most and loads.get(d.id, 0.0) + self.on_decode_s(req, d, d_hit) <= best_s:
            self.on_decode += 1
            return d.id
        return best

    def queue_s(self, p: WorkerView) -> float:
        """Prefill work queued on `p` (uncached tokens at its batch's throughput)."""
        q = p.queued_uncached
        if not q:
            return 0.0
        b = max(1, self.batch_tokens())
        return q * self.prefill_work(b) / b

    def on_decode_s(self, req: Request, d: WorkerView, hit: int) -> float:
        """Predicted TTFT of prefilling `req` on decode worker `d`, which holds `hit` tokens of it,
        within its slack (inf: nothing cached there, or no room or slack)."""
        if not hit:
            return math.inf
        need = blocks_for(req.prompt_len + req.output_len, d.block_size) - hit // d.block_size
        if d.free_blocks - d.pull_blocks_pending < need:
            return math.inf
        token = self.token
        chunk = token.chunk_tokens(d, hit)
        if not chunk:
            return math.inf
        b, scale, t_iter = d.num_decoding, token.cost_scale(d), token.t_iter(d)
        full, rest = divmod(d.queued_uncached, chunk)  # the queue ahead, priced at this request's prior
        t = full * (t_iter + token.chunk_cost(b, hit, chunk, scale))
        t += t_iter + token.chunk_cost(b, hit, rest, scale) if rest else 0.0
        prior = hit
        while prior < req.prefill_target:  # its own chunks, each attending to every token before it
            c = min(chunk if prior == hit else token.chunk_tokens(d, prior), req.prefill_target - prior)
            if not c:
                return math.inf
            t += t_iter + token.chunk_cost(b, prior, c, scale)
            prior += c
        return t
