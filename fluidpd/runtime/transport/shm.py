"""The "shm" KV transport: one host, across processes, KV blocks in POSIX shared memory.

`send` writes the payload's stacked `blocks` tensor into a fresh shared-memory segment (one
memcpy); `receive` maps the segment and wraps it zero-copy (a tensor over the mapping, via numpy
so that the mapping outlives every view: `torch.frombuffer` does not pin it, and unmapping under
a live view would crash); the engine's import is then the only copy on that side; `release`
unlinks the segment. Optionally (`pool_bytes`) the exporter reuses a pool of segments instead:
no fresh pages per transfer; `release` then marks the segment free.

Segments are named `fpkv_<pid>_<n>_<random>` under /dev/shm (`shm_segment`: their layout, mapping and
clean-up). A one-shot handle that is neither imported nor released keeps its segment until the
multiprocessing resource tracker cleans it up when the program ends (with a "leaked shared_memory" warning).
"""

from __future__ import annotations

import atexit
import itertools
import mmap
import os
import secrets
import threading
import time
from collections import OrderedDict
from multiprocessing import shared_memory

import numpy as np

from fluidpd.engine.kv_transfer import KVPayload
from fluidpd.runtime.transport.base import KVHandle, KVTransport, to_handle, to_payload, torch_dtype
from fluidpd.runtime.transport.shm_segment import (
    HEADER,
    RECV_FLAGS,
    SHM_DIR,
    SHM_PREFIX,
    PoolSegment,
    close_segment,
    leftover_segments,
    map_segment,
    segment_generation,
    tensor_view,
    unlink_segment,
    unlink_segments_of,
)

POOL_ROUND = 1 << 20  # pooled segment capacities are whole MiB
# the transport, and the segment helpers callers imported from here before `shm_segment` held them
__all__ = [
    "HEADER",
    "SHM_DIR",
    "SharedMemoryTransport",
    "leftover_segments",
    "segment_generation",
    "unlink_segments_of",
]


class SharedMemoryTransport(KVTransport):
    """One host, any processes: KV blocks in POSIX shared memory (/dev/shm).

    One-shot segments (the default): `send` creates a segment per handle, `release` unlinks it.
    Pooled segments (`pool_bytes` > 0, Linux): the exporter keeps up to `pool_bytes` of segments
    and reuses them, so a transfer writes into memory that is already faulted in (fresh pages
    cost several times a memcpy); the handle carries the segment's generation, `release` marks
    the segment free again (if it still holds that generation) instead of unlinking it, and
    importers keep their mappings of pooled segments (up to `max_cached_maps`). The pool's
    segments are unlinked by `close()` (the worker calls it on shutdown; also at exit).

    Memory safety: every tensor over a segment is built through numpy on the mapping, so the
    mapping lives as long as the last tensor viewing it; nothing is ever unmapped under a live
    view. On Linux a received segment is mapped straight from /dev/shm."""

    name = "shm"

    def __init__(self, pool_bytes: int = 0, max_cached_maps: int = 16) -> None:
        if pool_bytes < 0:
            raise ValueError(f"pool_bytes must be >= 0, got {pool_bytes}")
        self.pool_bytes = pool_bytes if os.path.isdir(SHM_DIR) else 0
        self.max_cached_maps = max_cached_maps
        self._pool: list[PoolSegment] = []
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()  # pooled segments received here
        self._attached: dict[str, shared_memory.SharedMemory] = {}  # non-Linux: segments received here
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._gen = itertools.count(1)
        self._atexit = False

    def _new_name(self) -> str:
        return f"{SHM_PREFIX}{os.getpid()}_{next(self._seq)}_{secrets.token_hex(4)}"

    # ------------------------------------------------------------------ send
    def send(self, payload: KVPayload) -> KVHandle:
        t0 = time.perf_counter()
        src = payload.blocks
        if src.device.type != "cpu":
            src = src.cpu()
        nbytes = src.numel() * src.element_size()
        if nbytes == 0:
            return to_handle(payload, self.name, timings={"send_s": time.perf_counter() - t0})
        seg, gen = self._acquire(nbytes) if self.pool_bytes else (None, 0)
        if seg is not None:
            try:
                tensor_view(seg.shm.buf, nbytes, src.dtype, tuple(src.shape), HEADER).copy_(src)
            except BaseException:
                seg.header[0] = 0
                raise
            return to_handle(
                payload,
                self.name,
                name=seg.shm.name,
                offset=HEADER,
                generation=gen,
                timings={"send_s": time.perf_counter() - t0},
            )
        shm = shared_memory.SharedMemory(name=self._new_name(), create=True, size=nbytes)
        try:
            tensor_view(shm.buf, nbytes, src.dtype, tuple(src.shape)).copy_(src)  # the one memcpy
        except BaseException:
            unlink_segment(shm)
            raise
        name = shm.name
        close_segment(shm)
        return to_handle(payload, self.name, name=name, timings={"send_s": time.perf_counter() - t0})

    def _acquire(self, nbytes: int) -> tuple[PoolSegment | None, int]:
        """A free pooled segment of at least `nbytes` (made or reused), marked busy; (None, 0) if
        the pool cannot hold it."""
        with self._lock:
            free = [s for s in self._pool if int(s.header[0]) == 0]
            fit = [s for s in free if s.capacity >= nbytes]
            if fit:
                seg = min(fit, key=lambda s: s.capacity)
            else:
                cap = -(-nbytes // POOL_ROUND) * POOL_ROUND
                used = sum(s.capacity for s in self._pool)
                for s in sorted(free, key=lambda s: s.capacity):  # make room: drop free small ones
                    if used + cap <= self.pool_bytes:
                        break
                    self._pool.remove(s)
                    s.drop()
                    used -= s.capacity
                if used + cap > self.pool_bytes:
                    return None, 0
                seg = PoolSegment(
                    shared_memory.SharedMemory(name=self._new_name(), create=True, size=HEADER + cap), cap
                )
                self._pool.append(seg)
                if not self._atexit:
                    atexit.register(self.close)
                    self._atexit = True
            gen = next(self._gen)
            seg.header[0] = gen
            return seg, gen

    # ------------------------------------------------------------------ receive
    def receive(self, handle: KVHandle) -> KVPayload:
        self._check(handle)
        dtype = torch_dtype(handle.dtype)
        if handle.name is None:
            import torch

            return to_payload(handle, torch.empty(handle.shape, dtype=dtype))
        if handle.generation:
            buf = self._pooled_map(handle.name)
            _check_size(handle, len(buf) - handle.offset)
            gen = int(np.frombuffer(buf, dtype=np.int64, count=1)[0])
            if gen != handle.generation:
                raise ValueError(
                    f"stale KV handle for {handle.request_id!r}: segment {handle.name!r} "
                    f"now holds generation {gen}, the handle {handle.generation} (released twice?)"
                )
        elif os.path.isdir(SHM_DIR):
            fd = os.open(os.path.join(SHM_DIR, handle.name), os.O_RDWR)
            try:
                _check_size(handle, os.fstat(fd).st_size)
                buf = mmap.mmap(fd, handle.nbytes, flags=RECV_FLAGS)  # populate: map all pages at once
            finally:
                os.close(fd)
        else:
            seg = shared_memory.SharedMemory(name=handle.name, create=False)
            with self._lock:
                self._attached[handle.name] = seg
            _check_size(handle, seg.size)
            buf = seg.buf
        return to_payload(handle, tensor_view(buf, handle.nbytes, dtype, handle.shape, handle.offset))

    def _pooled_map(self, name: str) -> mmap.mmap:
        with self._lock:
            buf = self._maps.get(name)
            if buf is not None:
                self._maps.move_to_end(name)
                return buf
        buf = map_segment(name, populate=True)
        with self._lock:
            self._maps[name] = buf
            while len(self._maps) > self.max_cached_maps:  # views keep an evicted mapping alive
                self._maps.popitem(last=False)
        return buf

    # ------------------------------------------------------------------ release
    def release(self, handle: KVHandle) -> None:
        self._check(handle)
        if handle.name is None:
            return
        if handle.generation:
            with self._lock:
                buf = self._maps.get(handle.name)
            if buf is None:
                try:
                    buf = map_segment(handle.name, length=HEADER)
                except FileNotFoundError:
                    return  # its owner is gone (and unlinked it)
            header = np.frombuffer(buf, dtype=np.int64, count=1)
            if int(header[0]) == handle.generation:
                header[0] = 0
            return
        with self._lock:
            seg = self._attached.pop(handle.name, None)
        if seg is None:
            try:
                seg = shared_memory.SharedMemory(name=handle.name, create=False)
            except FileNotFoundError:
                return  # already released
        unlink_segment(seg)

    def _check(self, handle: KVHandle) -> None:
        if handle.transport != self.name:
            raise ValueError(f"a {handle.transport!r} KV handle given to the {self.name!r} transport")

    # ------------------------------------------------------------------ lifetime
    def pool_segments(self) -> list[tuple[str, int, bool]]:
        """(name, capacity, busy) of this process's pooled segments."""
        with self._lock:
            return [(s.shm.name, s.capacity, int(s.header[0]) != 0) for s in self._pool]

    def open_segments(self) -> list[str]:
        """Segments this process attached through SharedMemory and has not released (non-Linux)."""
        with self._lock:
            return list(self._attached)

    def close(self) -> None:
        """Unlink this process's pooled segments and drop cached mappings; idempotent."""
        with self._lock:
            pool, self._pool = self._pool, []
            self._maps.clear()
        for s in pool:
            s.drop()


def _check_size(handle: KVHandle, size: int) -> None:
    if size < handle.nbytes:
        raise ValueError(
            f"shared-memory segment {handle.name!r} holds {size} bytes, the KV handle says {handle.nbytes}"
        )
