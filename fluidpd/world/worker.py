"""A simulated worker at iteration level: prefill queue, decode batch, paged KV accounting."""

from __future__ import annotations

from collections import deque

from fluidpd.core.piece import PrefillPiece
from fluidpd.core.request import Request
from fluidpd.policy.view import Role, blocks_for, group_blocks
from fluidpd.world.cached_kv import CachedKV
from fluidpd.world.decode_batch import DecodeBatch
from fluidpd.world.host_tier import HostTier
from fluidpd.world.prefix_cache import PrefixCache


class WorkerState(DecodeBatch, CachedKV):
    """One engine instance: implements the policy's WorkerView over O(1)-per-step bookkeeping.

    Prefix caching (`cache`): blocks are counted once however many requests share them; evictable
    cached blocks count as free, and an allocation that needs their room evicts the least recently
    used. A request's KV leaves through `release`, which keeps its hashed blocks cached.

    Its decode batch, and the lazy accounting of its KV growth and tokens, is `DecodeBatch`'s; which of a
    request's blocks are cached here, `CachedKV`'s.
    """

    __slots__ = (
        "admitted",
        "block_size",
        "borrowed_chunks",
        "busy",
        "busy_s",
        "cache",
        "deferred",
        "held",
        "host",
        "host_hits",
        "id",
        "kv_blocks_full",
        "kv_blocks_total",
        "kv_blocks_used",
        "node",
        "num_prefilling",
        "preemptions",
        "prefix_cache_corrections",
        "prefix_cache_hits",
        "prefix_cache_queries",
        "pull_blocks_pending",
        "pulls",
        "queue",
        "queued_cached",
        "queued_tokens",
        "role",
        "role_since",
        "routable",
        "schedule_pending",
        "step_growth",
        "step_time_ewma_s",
        "steps",
        "transfers_in",
        "transfers_out",
    )

    def __init__(self, wid: int, role: Role, node: int, kv_blocks: int, block_size: int = 16):
        if kv_blocks < 1:
            raise ValueError(f"worker {wid}: no memory left for KV blocks")
        self.id, self.role, self.node = wid, role, node
        self.routable = True
        self.block_size = block_size
        self.init_decode_batch(block_size)
        self.kv_blocks_total = kv_blocks
        self.kv_blocks_full = kv_blocks  # the whole arena as KV (decode role)
        self.transfers_out = 0
        self.transfers_in = 0
        self.deferred: list = []  # actions that wait for the step in flight
        self.step_growth = 0  # KV blocks the step in flight allocated for decode growth
        self.kv_blocks_used = 0
        self.pull_blocks_pending = 0
        self.queue: deque[Request | PrefillPiece] = deque()
        self.queued_tokens = 0
        self.queued_cached = 0  # of queued_tokens, those of unstarted requests expected to hit the cache here
        self.num_prefilling = 0
        self.held: dict[int, Request] = {}
        self.pulls: deque[Request] = deque()
        self.busy = False
        self.schedule_pending = False
        self.step_time_ewma_s = 0.0
        self.busy_s = {"prefill": 0.0, "decode": 0.0, "mixed": 0.0}
        self.steps = 0
        self.preemptions = 0
        self.borrowed_chunks = 0  # prefill chunks run here while a decode worker (FluidToken)
        self.role_since = 0.0
        self.cache = PrefixCache()
        self.host: HostTier | None = None  # the host-DRAM tier released blocks go to (its own or the node's)
        self.host_hits = 0  # of prefix_cache_hits, tokens loaded from the host tier
        self.prefix_cache_queries = 0  # prompt tokens of first admissions here
        self.prefix_cache_hits = 0  # ... whose prefill a cached prefix skipped
        self.prefix_cache_corrections = 0  # admissions whose engine held less than this view (runtime)
        self.admitted: list[Request | PrefillPiece] = []  # requests the step in flight admitted

    # --- WorkerView -------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_used

    @property
    def num_running(self) -> int:
        """Sequences computed here: decoding (a group's live ones), or prefilling a chunk."""
        return self.decode_rows + self.num_prefilling

    @property
    def num_waiting(self) -> int:
        """Requests queued here and not started, and hand-offs waiting to be pulled here."""
        return len(self.queue) - self.num_prefilling + len(self.pulls)

    @property
    def num_decoding(self) -> int:
        """Sequences decoding here (decode rows: a group counts its live ones), including those whose
        KV arrived during the step in flight."""
        if self.incoming:  # (routers read this of every worker per request: no generator when empty)
            return self.decode_rows + sum(r.live for r in self.incoming)
        return self.decode_rows

    @property
    def num_held(self) -> int:
        return len(self.held)

    @property
    def queued_uncached(self) -> int:
        """Prefill tokens of `queue` still to compute, less the cached prefixes expected to be skipped."""
        return self.queued_tokens - self.queued_cached

    @property
    def num_cached_blocks(self) -> int:
        """KV blocks held by hash here, live or evictable."""
        return self.cache.num_cached

    @property
    def evictable_blocks(self) -> int:
        """Cached blocks no request holds (counted as free)."""
        return self.cache.evictable

    # --- KV ----------------------------------------------------------------------------
    @staticmethod
    def stored(req: Request) -> int:
        """Tokens with KV on the worker once prefilled: the prompt plus all outputs but the last."""
        return req.prompt_len + req.generated - 1

    def blocks_of(self, req: Request) -> int:
        if req.id in self.synced:
            self.sync(req)
        return self.group_blocks(req, self.stored(req))

    def group_blocks(self, req: Request, stored: int) -> int:
        """KV blocks of `req` with `stored` tokens per sequence: a group holds its prompt's full blocks
        once and, per live sequence, the rest of its own."""
        if req.n == 1:
            return blocks_for(stored, self.block_size)
        return group_blocks(req.prompt_len, req.live, stored, self.block_size)

    def prefill_blocks(self, req: Request) -> int:
        """KV blocks `req` holds once its prefill (of `prefill_target` tokens) is done."""
        if req.n == 1:
            return blocks_for(req.prefill_target, self.block_size)
        return self.group_blocks(req, req.prompt_len + req.generated)

    def allocate(self, blocks: int) -> None:
        if blocks > self.kv_blocks_total - self.kv_blocks_used:  # (free_blocks, without a property call)
            raise RuntimeError(f"worker {self.id}: KV over-allocated")
        self.kv_blocks_used += blocks
        if self.cache.lru:
            self._trim_cache()

    def free(self, blocks: int) -> None:
        self.kv_blocks_used -= blocks
        if self.kv_blocks_used < 0:
            raise RuntimeError(f"worker {self.id}: freed more KV blocks than allocated")

    def resize(self, kv_blocks: int) -> None:
        """Re-slice the arena to `kv_blocks` (FluidRole's remap): cached blocks that no longer fit
        beside the live KV are evicted, the rest stay cached."""
        if kv_blocks < self.kv_blocks_used:
            raise RuntimeError(f"worker {self.id}: resize below live KV ({self.kv_blocks_used} blocks)")
        self.kv_blocks_total = kv_blocks
        self._trim_cache()

    def _trim_cache(self) -> None:
        """Evict the least recently used cached blocks that no longer fit beside the live KV (the
        host tier, if any, has them since their request released them)."""
        self.cache.evict(self.kv_blocks_used + self.cache.evictable - self.kv_blocks_total)

    # --- prefill queue ------------------------------------------------------------------
    def enqueue(self, req: Request | PrefillPiece, front: bool = False, in_order: bool = False) -> None:
        """Queue `req` last, first (`front`: behind the requests already started, which hold their KV
        here), or (`in_order`) behind the queued requests that arrived before it, but never ahead of
        one already started."""
        if in_order and isinstance(req, Request):
            i = len(self.queue)
            while i > 0:
                prev = self.queue[i - 1]
                if not isinstance(prev, Request) or prev.worker >= 0 or prev.arrival_s <= req.arrival_s:
                    break
                i -= 1
            self.queue.insert(i, req)
        elif front:
            i = 0
            while i < len(self.queue) and self.queue[i].worker >= 0:
                i += 1
            self.queue.insert(i, req)
        else:
            self.queue.append(req)
        self.queued_tokens += req.prefill_remaining
        if req.prefilled == 0 and isinstance(req, Request) and req.block_hashes:
            req.queued_hit = self.cached_tokens(req)
            self.queued_cached += req.queued_hit

    def dequeue(self, req: Request | PrefillPiece) -> None:
        if self.queue and self.queue[0] is req:
            self.queue.popleft()
        else:
            self.queue.remove(req)
        self.queued_tokens -= req.prefill_remaining
        self.started(req)

    def started(self, req: Request | PrefillPiece) -> None:
        """`req` leaves the unstarted part of the queue: its expected hit no longer counts."""
        if req.queued_hit:
            self.queued_cached -= req.queued_hit
            req.queued_hit = 0
