"""KV block allocation: a free list (lowest ids first) and per-sequence block tables."""

from __future__ import annotations

import heapq

from fluidpd.engine.sequence import Sequence


class NoFreeBlocksError(RuntimeError):
    """Not enough free KV blocks for what was asked."""


class BlockManager:
    """Hands out block ids of the arena's KV pool.

    Free ids are kept in a min-heap so allocation prefers low ids: a later shrink of the pool
    (`resize`) then has fewer live blocks to move."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks))  # sorted, hence a valid heap

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its table covers `num_tokens` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Grow `seq`'s block table to cover `num_tokens` tokens; the new ids."""
        need = self.needed(seq, num_tokens)
        if need > len(self._free):
            raise NoFreeBlocksError(f"request {seq.request_id}: needs {need} more KV block(s), {len(self._free)} free")
        new = [heapq.heappop(self._free) for _ in range(need)]
        seq.block_table.extend(new)
        return new

    def free(self, seq: Sequence) -> None:
        for b in seq.block_table:
            heapq.heappush(self._free, b)
        seq.block_table = []

    def resize(self, num_blocks: int, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Change the pool to `num_blocks` ids; (src, dst) moves for live blocks that fall outside.

        Rewrites the block tables of `seqs` (every sequence holding blocks). Raises ValueError
        when the live blocks do not fit."""
        old = self.num_blocks
        if num_blocks >= old:
            self._free.extend(range(old, num_blocks))  # larger than every id: still a heap
            self.num_blocks = num_blocks
            return []
        used = sum(len(s.block_table) for s in seqs)
        if used > num_blocks:
            raise ValueError(f"cannot shrink the KV pool to {num_blocks} blocks: {used} are in use")
        low_free = sorted(b for b in self._free if b < num_blocks)
        high_used = sorted(b for s in seqs for b in s.block_table if b >= num_blocks)
        remap = dict(zip(high_used, low_free))
        for s in seqs:
            if any(b >= num_blocks for b in s.block_table):
                s.block_table = [remap.get(b, b) for b in s.block_table]
        self._free = low_free[len(high_used) :]
        self.num_blocks = num_blocks
        return list(remap.items())
