"""The KV block pool: reference-counted block ids, and the prefix cache's index of full blocks by hash.

A free block is either plain (never hashed, or its hash was dropped) or cached: it keeps its hash,
stays findable, and sits in an LRU queue from which allocation evicts, oldest first, only once the
plain ones run out (vLLM's free-block queue). Plain ids live in a min-heap so allocation prefers low
ids and a later shrink of the pool (`resize`) has fewer live blocks to move. Torch-free.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict


class NoFreeBlocksError(RuntimeError):
    """Not enough free KV blocks for what was asked."""


class MissingCachedBlocks(ValueError):
    """A KV import skips leading blocks this pool does not hold cached (any more): the sender must send them."""


class BlockPool:
    """Block ids 0..num_blocks-1 with reference counts, a plain free heap, and cached (hashed) blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self._plain = list(range(num_blocks))  # sorted, hence a valid heap
        self._lru: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recently used first
        self.hash_of: dict[int, int] = {}  # block id -> hash, live or free
        self.block_of: dict[int, int] = {}  # hash -> block id
        self.freed_at: dict[int, float] = {}  # free cached block -> when its last reference went
        self.reuse_gaps_s: list[float] = []  # per cached block taken again: seconds it sat free
        self.idle_before_evict_s: list[float] = []  # per cached block evicted: seconds it sat free

    @property
    def num_free(self) -> int:
        return len(self._plain) + len(self._lru)

    @property
    def num_evictable(self) -> int:
        return len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self.hash_of)

    def is_evictable(self, block: int) -> bool:
        return block in self._lru

    # ------------------------------------------------------------------ allocation
    def get(self, n: int) -> list[int]:
        """`n` blocks with one reference each: plain ones first (lowest ids), then least recently used cached ones."""
        if n > self.num_free:
            raise NoFreeBlocksError(f"needs {n} KV block(s), {self.num_free} free")
        out = []
        for _ in range(n):
            if self._plain:
                b = heapq.heappop(self._plain)
            else:
                b, _ = self._lru.popitem(last=False)
                self.idle_before_evict_s.append(time.monotonic() - self.freed_at.pop(b))
                self._forget(b)
            self.refs[b] = 1
            out.append(b)
        return out

    def share(self, blocks: list[int]) -> None:
        """One more reference on each of `blocks` (a cache hit); a free cached one leaves the LRU."""
        for b in blocks:
            if self.refs[b] == 0:
                del self._lru[b]
                self.reuse_gaps_s.append(time.monotonic() - self.freed_at.pop(b))
            self.refs[b] += 1

    def release(self, blocks: list[int]) -> None:
        """One reference less on each, in order: a block left with none becomes free, cached ones
        at the LRU's most recent end (so the first released is the first evicted)."""
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self.hash_of:
                    self._lru[b] = None
                    self.freed_at[b] = time.monotonic()
                else:
                    heapq.heappush(self._plain, b)

    # ------------------------------------------------------------------ hashes
    def cache(self, block: int, block_hash: int) -> bool:
        """Index a full live block under its hash; False (nothing done) when the hash is already indexed."""
        if block_hash in self.block_of:
            return False
        self.hash_of[block] = block_hash
        self.block_of[block_hash] = block
        return True

    def lookup(self, hashes: list[int]) -> list[int]:
        """The block ids of the longest prefix of `hashes` that is indexed (no side effects)."""
        out = []
        for h in hashes:
            b = self.block_of.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def _forget(self, block: int) -> None:
        del self.block_of[self.hash_of.pop(block)]
        self.freed_at.pop(block, None)

    # ------------------------------------------------------------------ resize
    def resize(self, num_blocks: int) -> list[tuple[int, int]]:
        """Change the pool to `num_blocks` ids; (src, dst) for every block that moves below the end.

        Shrinking: live blocks beyond the end move to free low ids (plain ones first, then evicting
        the least recently used low cached ones); the low plain ids left over keep as many of the
        cached blocks beyond the end as fit, most recently used first; the others are dropped.
        ValueError when the live blocks do not fit."""
        old = self.num_blocks
        if num_blocks >= old:
            self._plain.extend(range(old, num_blocks))  # larger than every id: still a heap
            self.refs.extend([0] * (num_blocks - old))
            self.num_blocks = num_blocks
            return []
        live = sum(1 for r in self.refs if r > 0)
        if live > num_blocks:
            raise ValueError(f"cannot shrink the KV pool to {num_blocks} blocks: {live} are in use")
        high_live = [b for b in range(num_blocks, old) if self.refs[b] > 0]
        slots = sorted(b for b in self._plain if b < num_blocks)
        if len(high_live) > len(slots):
            evict = [b for b in self._lru if b < num_blocks][: len(high_live) - len(slots)]
            for b in evict:
                del self._lru[b]
                self._forget(b)
            slots = sorted(slots + evict)
        moves = list(zip(high_live, slots))
        rest = slots[len(high_live) :]
        high_cached = [b for b in reversed(self._lru) if b >= num_blocks]  # most recent first
        kept = list(zip(high_cached, rest))
        for b in high_cached[len(kept) :]:
            del self._lru[b]
            self._forget(b)
        moves += kept
        remap = dict(moves)
        for src, dst in moves:
            self.refs[dst] = self.refs[src]
            if src in self.hash_of:
                h = self.hash_of.pop(src)
                self.hash_of[dst], self.block_of[h] = h, dst
        self._lru = OrderedDict((remap.get(b, b), None) for b in self._lru)
        self.freed_at = {remap.get(b, b): t for b, t in self.freed_at.items()}
        self._plain = rest[len(kept) :]  # sorted: a valid heap
        del self.refs[num_blocks:]
        self.num_blocks = num_blocks
        return moves
