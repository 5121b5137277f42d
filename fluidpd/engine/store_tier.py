"""The engine's second KV tier: its arena's full blocks written through to a KV store, and read back.

A sequence's indexed full blocks are written to the store when it lets them go (finished, aborted,
exported, preempted): written through, not at eviction, so a session's KV outlives the worker that
computed it (killed, or its arena re-sliced). The blocks go tail first, so the store evicts a
prefix's end before its start. The copies run on a writer thread, off the step's path (vLLM's
connector stores asynchronously too): the blocks keep one reference until their copy is done, and the
engine lets go of them at its next step (or at once, waiting for the writer, when it needs the room).
At admission, the blocks a plan names as cached beyond the arena's own hit are read from the store
into the blocks just allocated for them (checked there; a block that fails is computed with the chunk
instead).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import replace

import numpy as np
import torch

from fluidpd.engine.arena import KVArena
from fluidpd.engine.block_manager import BlockManager
from fluidpd.engine.kvstore import KVStore, SharedKVStore
from fluidpd.engine.outputs import TRAFFIC, KVTierActivity
from fluidpd.engine.sequence import Sequence


class StoreTier:
    """Write-through to, and loads from, one KV store for one engine's arena."""

    def __init__(self, store: KVStore, arena: KVArena, blocks: BlockManager) -> None:
        if store.block_bytes != arena.block_bytes:
            raise ValueError(f"KV store blocks are {store.block_bytes} bytes, this arena's {arena.block_bytes}")
        self.store, self.arena, self.blocks = store, arena, blocks
        blocks.on_free = self.offload
        self._seen = replace(store.stats)  # counters at the last report
        self._jobs: queue.Queue[tuple[list[int], list[int]] | None] = queue.Queue()
        self._done: deque[list[int]] = deque()  # block ids written, their references still to drop
        self.pending = 0  # writes queued or running
        self._writer: threading.Thread | None = None

    @classmethod
    def open(cls, path: str, size_bytes: int, arena: KVArena, blocks: BlockManager, layout: str) -> StoreTier:
        return cls(SharedKVStore(path, size_bytes, arena.block_bytes, layout), arena, blocks)

    def _bytes(self, block: int) -> np.ndarray | None:
        """Block `block` of the arena as uint8 (a view on the CPU; None elsewhere: staged)."""
        if self.arena.device.type != "cpu":
            return None
        return self.arena.kv[block].view(-1).view(torch.uint8).numpy()

    def offload(self, seq: Sequence) -> None:
        """Queue `seq`'s indexed full blocks for the store, tail first (those there are refreshed);
        each keeps a reference until its copy is done."""
        n, dead = len(seq.block_hashes), seq.num_dead_blocks  # dead blocks were freed: not read here
        ids, hashes = seq.block_table[dead:n][::-1], seq.block_hashes[dead:n][::-1]
        self.blocks.pool.share(ids)
        self.pending += 1
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="kv-store-writer", daemon=True)
            self._writer.start()
        self._jobs.put((ids, hashes))

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            ids, hashes = job
            try:
                self.store.put(hashes, lambda i, out, ids=ids: self._copy_out(ids[i], out))
            finally:
                self._done.append(ids)
                self._jobs.task_done()

    def _copy_out(self, block: int, out: np.ndarray) -> None:
        src = self._bytes(block)
        if src is None:
            out[:] = self.arena.kv[block].reshape(-1).view(torch.uint8).cpu().numpy()
        else:
            np.copyto(out, src)

    def collect(self) -> None:
        """Drop the references of the blocks whose copies are done (they become evictable)."""
        while self._done:
            self.blocks.pool.release(self._done.popleft())
            self.pending -= 1

    def flush(self) -> None:
        """Wait for every queued copy, then `collect` (before a resize moves blocks, or for room)."""
        if self.pending:
            self._jobs.join()
            self.collect()

    def load(self, seq: Sequence, upto_blocks: int) -> int:
        """After its arena hits, fill `seq`'s next blocks (up to `upto_blocks` in all, already
        allocated) from the store and index them; returns the tokens loaded."""
        bs = self.blocks.block_size
        start = seq.num_computed // bs
        if upto_blocks <= start:
            return 0
        hashes = self.blocks.hashes(seq.token_ids, upto_blocks, seq.block_hashes)[start:]
        ids = seq.block_table[start:upto_blocks]
        views = [self._bytes(b) for b in ids]
        staged = views[0] is None
        if staged:
            views = [np.empty(self.arena.block_bytes, np.uint8) for _ in ids]
        got = self.store.get(hashes, views)
        if staged and got:
            data = torch.from_numpy(np.stack(views[:got])).view(self.arena.dtype)
            self.arena.write_blocks(ids[:got], data.view(got, *self.arena.block_shape))
        seq.num_computed += got * bs
        self.blocks.register(seq)
        return got * bs

    def report(self, act: KVTierActivity) -> None:
        """Add the store's traffic since the last report (and its samples) to `act`."""
        self.collect()
        now, seen = self.store.report(), self._seen
        for k in TRAFFIC:
            setattr(act, k, getattr(now, k) - getattr(seen, k))
        if act.loaded_blocks or act.offloaded_blocks:
            act.store_used_blocks, act.store_capacity_blocks = now.used_blocks, now.capacity_blocks
        if now.reuse_gaps_s:
            act.reuse_gaps_s["store"] = now.reuse_gaps_s
        if now.idle_before_evict_s:
            act.idle_before_evict_s["store"] = now.idle_before_evict_s
        self._seen = now

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._jobs.put(None)
            self._writer.join()
        self.blocks.on_free = None
        self.store.close()
