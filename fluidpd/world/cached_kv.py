"""A worker's prefix-cache accounting: which of a request's leading KV blocks are cached on it (in
device memory, then in its host tier), taken at admission or before a move, registered once computed,
and kept cached when the request's KV is released."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluidpd.core.request import Request

if TYPE_CHECKING:
    from fluidpd.world.host_tier import HostTier
    from fluidpd.world.prefix_cache import PrefixCache


class CachedKV:
    """Mixin of WorkerState: its KV blocks held by hash (`cache`, and the host tier `host`), counted once
    however many requests share them."""

    __slots__ = ()

    if TYPE_CHECKING:  # what WorkerState provides
        block_size: int
        kv_blocks_used: int
        cache: PrefixCache
        host: HostTier | None

        @staticmethod
        def stored(req: Request) -> int: ...
        def blocks_of(self, req: Request) -> int: ...
        def allocate(self, blocks: int) -> None: ...
        def free(self, blocks: int) -> None: ...

    def cached_tokens(self, req: Request, blocks: tuple[int, int] | None = None) -> int:
        """Leading tokens of `req` whose KV is cached here, in device memory and then in the host
        tier: full blocks, at most all but its last token to prefill (that one is always computed;
        a block-aligned prompt cached whole in device memory copies its last block and computes
        only that token, as the engine does). `blocks`: `cached_blocks(req)` when the caller has it."""
        if not req.block_hashes:  # no ids, no tail (routers ask this of every worker per request)
            return 0 if blocks is None else (blocks[0] + blocks[1]) * self.block_size
        device, host = self.cached_blocks(req) if blocks is None else blocks
        return (device + host) * self.block_size + self._whole_tail(req, device, host)

    def _whole_tail(self, req: Request, device: int, host: int) -> int:
        """block_size - 1 when `req`'s block-aligned prompt is cached whole in device memory (its last
        block is copied, all but its last token taken from it); else 0."""
        n, rest = divmod(self._cache_span(req), self.block_size)
        if rest or host or device != n - 1 or len(req.block_hashes) < n:
            return 0
        return self.block_size - 1 if req.block_hashes[n - 1] in self.cache else 0

    @staticmethod
    def _cache_span(req: Request) -> int:
        """Tokens of `req`'s prefill that one sequence holds: a group's cache hit is of its prompt only."""
        return req.prefill_target if req.n == 1 else req.prompt_len

    def cached_blocks(self, req: Request) -> tuple[int, int]:
        """(device, host): `req`'s leading blocks cached in device memory, and the run after them
        in the host tier."""
        if not req.block_hashes:  # (what the matches below find for no ids)
            return 0, 0
        hashes, limit = req.block_hashes, (self._cache_span(req) - 1) // self.block_size
        n = self.cache.match(hashes, limit)
        return n, (self.host.match(hashes, n, limit) if self.host is not None else 0)

    def take_cached(self, req: Request) -> tuple[int, int]:
        """At `req`'s admission: hold its cached leading blocks, loading the host tier's into the
        arena; returns (the tokens they cover, the blocks loaded from the host tier)."""
        device, host = self.cached_blocks(req)
        tail = self._whole_tail(req, device, host)
        self._hold(req, device)
        if host:
            hashes = req.block_hashes
            self.host.load(hashes[device : device + host])  # type: ignore[union-attr]  # (recent before room is made)
            self.allocate(host)
            self.free(self.cache.register(req.id, hashes, device + host))
        return (device + host) * self.block_size + tail, host

    def take_moved(self, req: Request) -> int:
        """Before `req`'s KV moves here: hold the leading blocks of its stored KV (prompt and answer
        so far) cached here; returns how many (they need not move)."""
        return self._hold(req, self.cache.match(req.block_hashes, self.stored(req) // self.block_size))

    def _hold(self, req: Request, n: int) -> int:
        """`req` takes refs on its first `n` blocks, all cached here (reviving evictable ones); returns n."""
        if n:
            self.kv_blocks_used += self.cache.acquire(req.id, req.block_hashes, n)  # type: ignore[misc]  # (a slot of WorkerState)
        return n

    def register(self, req: Request, tokens: int) -> None:
        """`req`'s KV of its first `tokens` tokens is computed (or arrived) here: its full hashed
        blocks join the cache, shared with (and deduplicated against) the copies already here."""
        hashes = req.block_hashes
        if hashes:
            self.free(self.cache.register(req.id, hashes, min(len(hashes), tokens // self.block_size)))

    def release(self, req: Request, blocks: int | None = None, tokens: int | None = None, moved: bool = False) -> None:
        """Free `req`'s KV here: `blocks` blocks (default `blocks_of(req)`); its full hashed blocks
        among its first `tokens` tokens of valid KV (default `stored(req)`) stay cached, evictable
        (`moved`: its KV lives on where it went, so these are the first to evict)."""
        if blocks is None:
            blocks = self.blocks_of(req)
        hashes = req.block_hashes
        if not hashes:
            self.free(blocks)
            return
        if tokens is None:
            tokens = self.stored(req)
        n = min(len(hashes), tokens // self.block_size)
        held, unreferenced = self.cache.release(req.id, hashes, n, moved)
        self.free(blocks - held + unreferenced)
        if self.host is not None and n:  # written through, tail first (the tier evicts a prefix's end first)
            self.host.offload(hashes[n - 1 :: -1])
