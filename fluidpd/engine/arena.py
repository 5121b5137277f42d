"""The arena: one preallocated tensor per engine, split into a paged KV block pool and scratch.

Layout (elements of the KV dtype: `EngineConfig.kv_cache_dtype`, float16 on the CPU by default, whatever
the model computes in; every reader converts to the query's dtype, every writer rounds to the arena's):

    buffer = [ KV blocks 0 .. n-1 | scratch ............................... ]
    KV view: [n, num_layers, 2 (k, v), block_size, num_kv_heads, head_dim]   (block-major)

Block-major means a block's KV for every layer is one contiguous chunk, so shrinking the KV
part keeps a prefix of the buffer, and exporting or moving a block copies one chunk.
`resize_kv(n)` re-slices the same buffer (FluidRole's memory remap): no allocation, no reload.
On the CPU the buffer is the OS's zero pages until written, so an arena costs resident memory only
for the blocks it has used.
Scratch holds the attention workspace (gathered K/V of a step), so a prefill-leaning worker
that shrinks KV gets room for long-context gathers without allocating.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fluidpd.engine.kv_transfer import KVLayout


class KVArena:
    """One preallocated buffer: KV blocks at the front, scratch behind them; re-sliced in place."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        total_bytes: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.block_shape = (num_layers, 2, block_size, num_kv_heads, head_dim)
        self.block_numel = math.prod(self.block_shape)
        self.dtype, self.device = dtype, torch.device(device)
        numel = total_bytes // dtype.itemsize
        if num_blocks * self.block_numel > numel:
            raise ValueError(
                f"arena of {total_bytes} bytes cannot hold {num_blocks} KV blocks of {self.block_bytes} bytes"
            )
        self.buffer = _zeros(numel, dtype, self.device)
        self._slice(num_blocks)

    @classmethod
    def for_layout(
        cls, layout: KVLayout, num_blocks: int, total_bytes: int, dtype: torch.dtype, device: torch.device | str
    ) -> KVArena:
        """An arena of `total_bytes` holding `num_blocks` KV blocks of `layout`."""
        return cls(
            num_layers=layout.num_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            block_size=layout.block_size,
            num_blocks=num_blocks,
            total_bytes=total_bytes,
            dtype=dtype,
            device=device,
        )

    # ------------------------------------------------------------------ geometry
    @property
    def block_bytes(self) -> int:
        return self.block_numel * self.dtype.itemsize

    @property
    def max_blocks(self) -> int:
        """KV blocks the arena holds if scratch shrinks to nothing."""
        return self.buffer.numel() // self.block_numel

    @property
    def total_bytes(self) -> int:
        return self.buffer.numel() * self.dtype.itemsize

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def scratch_bytes(self) -> int:
        return self.scratch.numel() * self.dtype.itemsize

    def _slice(self, num_blocks: int) -> None:
        n = num_blocks * self.block_numel
        self.num_blocks = num_blocks
        self.kv = self.buffer[:n].view(num_blocks, *self.block_shape)
        self.scratch = self.buffer[n:]
        # per-layer views [num_blocks, block_size, kv_heads, head_dim] (strided, no copy)
        self.k_layers = [self.kv[:, layer, 0] for layer in range(self.block_shape[0])]
        self.v_layers = [self.kv[:, layer, 1] for layer in range(self.block_shape[0])]

    # ------------------------------------------------------------------ resize
    def resize(self, num_blocks: int, moves: list[tuple[int, int]]) -> None:
        """Re-slice to `num_blocks` KV blocks after copying each live block `src` -> `dst`.

        The block manager chose `moves` (live ids >= num_blocks to free ids < num_blocks)."""
        if not 1 <= num_blocks <= self.max_blocks:
            raise ValueError(f"num_blocks must be in [1, {self.max_blocks}] for this arena, got {num_blocks}")
        self.copy_blocks(moves)
        self._slice(num_blocks)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy each block `src` into block `dst` (every layer's K and V: one contiguous chunk, no temporary)."""
        for src, dst in pairs:
            self.kv[dst].copy_(self.kv[src])

    # ------------------------------------------------------------------ KV hand-off
    def read_blocks(self, block_ids: list[int], device: torch.device | str | None = None) -> torch.Tensor:
        """A copy of the given blocks, [len, num_layers, 2, block_size, kv_heads, head_dim]."""
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        out = self.kv.index_select(0, idx)
        return out if device is None else out.to(device)

    def write_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        if tuple(data.shape) != (len(block_ids), *self.block_shape):
            raise ValueError(
                f"block data of shape {tuple(data.shape)} does not fit "
                f"{len(block_ids)} blocks of shape {self.block_shape}"
            )
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        self.kv.index_copy_(0, idx, data.to(device=self.device, dtype=self.dtype))

    # ------------------------------------------------------------------ workspace
    def workspace(self, shape: tuple[int, ...], slot: int) -> torch.Tensor:
        """A [shape] buffer for one layer's gathered K (slot 0) or V (slot 1) pages: a view of
        scratch when both fit (reused by every layer and group, so it stays cache-resident),
        else a fresh tensor."""
        numel = math.prod(shape)
        if 2 * numel <= self.scratch.numel():
            return self.scratch[slot * numel : (slot + 1) * numel].view(shape)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def gather(self, cache: torch.Tensor, block_ids: torch.Tensor, slot: int) -> torch.Tensor:
        """cache[block_ids] (one layer's K or V pages) written into the workspace."""
        out = self.workspace((block_ids.numel(), *cache.shape[1:]), slot)
        return torch.index_select(cache, 0, block_ids, out=out)


ALIGN = 64  # bytes: a cache line, as torch aligns its own CPU tensors


def _zeros(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer. Zeroed, not empty: attention reads the stale tail of a sequence's last block
    (masked), and masked garbage must stay finite (0 * NaN would poison the output). On the CPU its
    pages are the OS's zero pages until written (calloc: resident memory grows with the KV used;
    torch.zeros would write every byte at start)."""
    if device.type != "cpu":
        return torch.zeros(numel, dtype=dtype, device=device)
    nbytes = numel * dtype.itemsize
    raw = torch.from_numpy(np.zeros(nbytes + ALIGN, dtype=np.uint8))
    skip = -raw.data_ptr() % ALIGN
    return raw[skip : skip + nbytes].view(dtype)
