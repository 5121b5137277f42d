"""The router tier of `fluidpd-pools`: which pool takes a new request, in O(pools), from aggregates.

Each pool publishes, once a control cycle (its own tick, over its own workers: `Pool.refresh`), its
prefill backlog (uncached tokens queued on the workers that prefill its prompts), how many routable
prefill workers clear it, and its decode pool's free KV. Between two of its cycles the tier adds
what it routed there itself (`Pool.routed`), so a burst inside one 10 ms period spreads instead of
landing on the pool that looked emptiest at the last tick.

A request goes to the pool with the least predicted TTFT, priced as the pools' routers price a
worker (`KvAffinity`): the pool's queued prefill work per prefill worker (at L_m's throughput) plus
this request's uncached prefill there, f_P(prompt - hit). The hit is what the prefix-to-pool index
says the pool holds: the session's last turn went there (its context, exactly), or a request that
shared this one's first d blocks was routed there, for d = 1, 2, 4, ... and the prompt's full
blocks (so a system prompt or a session's earlier turns are found within a factor of two). A pool
whose decode side has no free KV for the request, or whose DPI (at its last tick) is above
theta_D_high, goes last: more decodes there would miss TBT. A hot prefix therefore sticks to its
pool while that saves more than the pool's extra queue costs, and spreads when it does not, as
the routers inside a pool do; the index is a hint (a pool's cache may have evicted it), which the
pool's own router checks against its workers' real caches.
"""

from __future__ import annotations

from collections.abc import Callable

from fluidpd.core.request import Request

INDEX_ENTRIES = 1 << 18  # prefixes and sessions remembered (least recently routed forgotten first)


class PrefixIndex:
    """Which pools a prefix (a block hash at a probe depth) or a session was routed to, LRU-bounded."""

    def __init__(self, entries: int = INDEX_ENTRIES):
        self.entries = entries
        self.pools: dict[int, int] = {}  # block hash -> bit mask of pools
        self.sessions: dict[int, tuple[int, int]] = {}  # session -> (pool, its context's tokens)

    @staticmethod
    def depths(blocks: int) -> list[int]:
        """Probe depths in blocks: powers of two below `blocks`, then `blocks`."""
        out, d = [], 1
        while d < blocks:
            out.append(d)
            d *= 2
        if blocks:
            out.append(blocks)
        return out

    def hits(self, req: Request, block_size: int) -> dict[int, int]:
        """Pool -> leading tokens of `req` it is thought to hold."""
        found: dict[int, int] = {}
        hashes, blocks = req.block_hashes, req.prompt_len // block_size
        blocks = min(blocks, len(hashes))
        for d in reversed(self.depths(blocks)):
            mask = self.pools.get(hashes[d - 1], 0)
            while mask:
                low = mask & -mask
                mask ^= low
                p = low.bit_length() - 1
                if p not in found:
                    found[p] = d * block_size
        if req.session >= 0:
            last = self.sessions.get(req.session)
            if last is not None:
                found[last[0]] = max(found.get(last[0], 0), min(last[1], req.prompt_len - 1))
        return found

    def add(self, req: Request, pool: int, block_size: int) -> None:
        """`req` was routed to `pool`: its prompt's prefixes (and session) are held there now."""
        hashes = req.block_hashes
        bit = 1 << pool
        for d in self.depths(min(req.prompt_len // block_size, len(hashes))):
            h = hashes[d - 1]
            mask = self.pools.pop(h, 0)
            self.pools[h] = mask | bit  # (re-inserted: the most recently routed last)
        if req.session >= 0:
            self.sessions.pop(req.session, None)
            self.sessions[req.session] = (pool, req.prompt_len + req.output_len)
        for table in (self.pools, self.sessions):
            while len(table) > self.entries:
                del table[next(iter(table))]


class PoolRouter:
    """Picks a pool per request from the pools' aggregates and the prefix-to-pool index."""

    def __init__(self, pools: list, prefill_work: Callable[[float], float], dpi_high: float):
        self.pools = pools
        self.dpi_high = dpi_high  # a pool whose DPI is above this (theta_D_high) takes no more decodes
        self.prefill_work = prefill_work  # f_P as the pools' worlds run it
        self.index = PrefixIndex()
        self.block_size = 0

    def priced(self, req: Request, block_size: int) -> list[tuple[bool, float, int]]:
        """(no decode room or DPI high, predicted TTFT, pool) of every pool for `req`: O(pools), read-only
        (`routed` records the choice)."""
        self.block_size = block_size
        hits = self.index.hits(req, block_size)
        base = self.prefill_work(req.prefill_target)
        need = -(-(req.prompt_len + req.output_len) // block_size)
        keys = []
        for p in self.pools:
            hit = hits.get(p.index, 0)
            own = self.prefill_work(req.prefill_target - hit) if hit else base
            keys.append((p.decode_free < need or p.policy.pressure.dpi > self.dpi_high, p.wait_s() + own, p.index))
        return keys

    def pick(self, req: Request, block_size: int) -> int:
        """The pool with the least predicted TTFT for `req` (one with decode room and DPI below
        theta_D_high first)."""
        return min(self.priced(req, block_size))[2]

    def routed(self, req: Request, pool: int, uncached: int) -> None:
        """`req` went to `pool`, `uncached` of its tokens to prefill there."""
        p = self.pools[pool]
        p.queued_tokens += uncached
        p.decode_free -= -(-(req.prompt_len + req.output_len) // self.block_size)
        self.index.add(req, pool, self.block_size)
