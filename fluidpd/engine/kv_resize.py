"""FluidRole's memory remap on one engine: re-slice its arena between KV blocks and scratch, in place."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from fluidpd.engine.outputs import ResizeResult

if TYPE_CHECKING:
    from fluidpd.engine.arena import KVArena
    from fluidpd.engine.sequence import Sequence
    from fluidpd.engine.store_tier import StoreTier


class KVResize:
    """Mixin of LLMEngine: `resize_kv`, the remap phase of a role switch (no restart, no weight reload)."""

    if TYPE_CHECKING:  # what LLMEngine provides
        arena: KVArena
        blocks: Any
        seqs: dict[str, Sequence]
        tier: StoreTier | None

    def resize_kv(self, num_blocks: int) -> ResizeResult:
        """Re-slice the arena to `num_blocks` KV blocks (the rest is scratch), in place.

        Shrinking copies live blocks that fall outside into free low ids and rewrites block
        tables; ValueError if the live blocks do not fit or the arena is too small."""
        if not isinstance(num_blocks, int) or not 1 <= num_blocks <= self.arena.max_blocks:
            raise ValueError(f"num_blocks must be in [1, {self.arena.max_blocks}], got {num_blocks!r}")
        t0 = time.perf_counter()
        if self.tier is not None:
            self.tier.flush()  # the writer reads blocks by id: none may move under it
        old = self.blocks.num_blocks
        moves = self.blocks.resize(num_blocks, [s for s in self.seqs.values() if s.block_table])
        self.arena.resize(num_blocks, moves)
        if self.arena.device.type == "cuda":
            torch.cuda.synchronize(self.arena.device)
        return ResizeResult(old, num_blocks, len(moves), time.perf_counter() - t0)
