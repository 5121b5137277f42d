"""A worker's prefix cache as the lifecycle sees it: KV blocks named by hash, shared, reference-counted.

vLLM's automatic prefix caching, counted rather than stored: a live block (held by at least one request)
has a reference count; a block nobody holds stays cached in an LRU of evictable blocks until an
allocation needs its room. Every request holds refs on a leading run of its `block_hashes` (`held`);
its other blocks are private to it. The worker counts live blocks once in `kv_blocks_used` and the
evictable ones as free (`WorkerState` keeps used + evictable <= the arena). Each operation costs
O(blocks it touches).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice, takewhile


class PrefixCache:
    """Reference counts of live blocks by hash, an LRU of evictable ones, each request's held run."""

    __slots__ = ("held", "known", "lru", "refs", "reused")

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}  # live block hash -> requests holding it
        self.lru: OrderedDict[int, None] = OrderedDict()  # evictable cached blocks, least recently used first
        self.held: dict[int, int] = {}  # request id -> leading blocks of its hashes it holds refs on
        self.known: set[int] = set()  # refs | lru: one membership test per block when matching
        self.reused: set[int] = set()  # cached blocks some request took as a hit (never demoted)

    @property
    def evictable(self) -> int:
        return len(self.lru)

    @property
    def num_cached(self) -> int:
        """Blocks held by hash here, live or evictable."""
        return len(self.refs) + len(self.lru)

    def __contains__(self, h: int) -> bool:
        return h in self.known

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of `hashes` (at most `limit`) are cached here, live or evictable."""
        if limit <= 0 or not hashes or hashes[0] not in self.known:
            return 0
        return sum(1 for _ in takewhile(self.known.__contains__, islice(hashes, limit)))

    def acquire(self, rid: int, hashes: Sequence[int], n: int) -> int:
        """Request `rid` takes refs on hashes[:n] (all cached); returns how many it revived from the LRU."""
        refs, lru = self.refs, self.lru
        revived = 0
        for h in hashes[:n]:
            if h in refs:
                refs[h] += 1
            else:
                del lru[h]
                refs[h] = 1
                revived += 1
        self.reused.update(hashes[:n])
        self.held[rid] = n
        return revived

    def register(self, rid: int, hashes: Sequence[int], n: int) -> int:
        """`rid`'s computed private blocks up to hashes[:n] become its held, shared blocks; returns how
        many of them it drops for a live copy already here (those blocks are freed)."""
        start = self.held.get(rid, 0)
        if n <= start:
            return 0
        refs, lru = self.refs, self.lru
        dropped = 0
        for h in hashes[start:n]:
            if h in refs:
                refs[h] += 1
                dropped += 1
            else:
                lru.pop(h, None)  # an evictable copy: ours replaces it
                refs[h] = 1
                self.known.add(h)
        self.held[rid] = n
        return dropped

    def release(self, rid: int, hashes: Sequence[int], n: int, demote: bool = False) -> tuple[int, int]:
        """`rid` lets go: its refs drop (a block nobody holds becomes evictable) and its private blocks
        among hashes[:n] become evictable unless cached already. Tail first, as vLLM frees, so the LRU
        evicts a prefix's end before its start; with `demote` those no request has ever taken as a hit
        join the LRU's old end instead (a copy that lives on where the request went; a shared prefix
        stays recent). Returns (blocks it held, of which now unreferenced)."""
        held = self.held.pop(rid, 0)
        refs, lru = self.refs, self.lru
        unreferenced = 0
        freed = []  # tail first
        for i in range(max(n, held) - 1, -1, -1):
            h = hashes[i]
            if i < held:
                k = refs[h] - 1
                if k:
                    refs[h] = k
                    continue
                del refs[h]
                unreferenced += 1
            elif h in refs:
                continue
            freed.append(h)
        reused = self.reused
        for h in freed:  # tail first: the end of the prefix is evicted first
            lru[h] = None
            lru.move_to_end(h)
        if demote:  # ... and before anything else, the blocks no other request has taken as a hit
            for h in [h for h in reversed(freed) if h not in reused]:
                lru.move_to_end(h, last=False)
        self.known.update(freed)
        return held, unreferenced

    def evict(self, blocks: int) -> None:
        """Drop the `blocks` least recently used evictable blocks."""
        lru, known, reused = self.lru, self.known, self.reused
        for _ in range(min(blocks, len(lru))):
            h = lru.popitem(last=False)[0]
            known.discard(h)
            reused.discard(h)
