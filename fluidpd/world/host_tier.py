"""A second KV tier in host DRAM: what vLLM's CPU offloading, SGLang HiCache's host pool and Dynamo
KVBM's G2 hold.

A request's full blocks are written here by hash when it releases them (written through, as vLLM's
offloading connector and SGLang HiCache's default policy do, rather than at eviction: so a
session's KV outlives a worker that dies or re-slices its arena); a request whose device prefix
ends where this tier still holds the next blocks loads them back instead of recomputing them. LRU
over a bounded number of blocks; `reused_only` stores a block only the second time it is released
(vLLM's `FilterReusedOffloadingManager`: a block seen once is usually never asked for again). One
tier per worker, or one shared by a node's workers (Mooncake Store's shape: any worker of the node
hits what another offloaded). Counted, not stored, like `PrefixCache`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice, takewhile


@dataclass(slots=True)
class HostTier:
    """Block hashes in host memory, least recently used first, at most `capacity_blocks`."""

    capacity_blocks: int
    reused_only: bool = False
    pooled: bool = False  # shared by a node's workers (outlives any one of them)
    lru: OrderedDict = field(default_factory=OrderedDict)
    seen: OrderedDict = field(default_factory=OrderedDict)  # released once, not stored (reused_only)
    offloaded_blocks: int = 0  # written here
    loaded_blocks: int = 0  # read back into a device arena
    evicted_blocks: int = 0  # dropped for room

    def __post_init__(self) -> None:
        if self.capacity_blocks < 1:
            raise ValueError("a host tier holds at least one block")

    def __len__(self) -> int:
        return len(self.lru)

    def __contains__(self, h: int) -> bool:
        return h in self.lru

    def offload(self, hashes: Iterable[int]) -> int:
        """Blocks a request released, least recent first: store them (the last most recent); returns
        how many were written (a block already here is only refreshed)."""
        lru, written = self.lru, 0
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            if self.reused_only and h not in self.seen:
                self.seen[h] = None
                if len(self.seen) > self.capacity_blocks:
                    self.seen.popitem(last=False)
                continue
            self.seen.pop(h, None)
            lru[h] = None
            written += 1
            if len(lru) > self.capacity_blocks:
                lru.popitem(last=False)
                self.evicted_blocks += 1
        self.offloaded_blocks += written
        return written

    def match(self, hashes: Sequence[int], start: int, limit: int) -> int:
        """How many blocks of `hashes` from index `start` (at most `limit` in all) are here in a run."""
        if start >= limit or start >= len(hashes) or hashes[start] not in self.lru:
            return 0
        return sum(1 for _ in takewhile(self.lru.__contains__, islice(hashes, start, limit)))

    def load(self, hashes: Sequence[int]) -> None:
        """`hashes` (all here) are copied back into a device arena: they become the most recent."""
        for h in hashes:
            self.lru.move_to_end(h)
        self.loaded_blocks += len(hashes)

    def fresh(self) -> HostTier:
        """What a replacement worker gets: the node's pool itself, or an empty tier of its own."""
        return self if self.pooled else HostTier(self.capacity_blocks, self.reused_only)


def attach_host_tiers(workers: Sequence, blocks: int, pooled: bool, reused_only: bool = False) -> None:
    """Give each worker a host tier of `blocks` blocks, or (`pooled`) one per node holding its
    workers' share together."""
    if not pooled:
        for w in workers:
            w.host = HostTier(blocks, reused_only)
        return
    per_node = Counter(w.node for w in workers)
    pools = {n: HostTier(blocks * k, reused_only, pooled=True) for n, k in per_node.items()}
    for w in workers:
        w.host = pools[w.node]
