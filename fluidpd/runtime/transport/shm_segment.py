"""The POSIX shared-memory segments of the "shm" KV transport (`fluidpd.runtime.transport.shm`): their
names under /dev/shm, a pooled segment's layout, mapping one, zero-copy tensors over it, unlinking it, and
finding (or removing) the segments a process left behind.

A segment is named `fpkv_<pid>_<n>_<random>`. A pooled segment holds an int64 generation at byte 0
(0: free) and the blocks from byte HEADER on; a one-shot segment holds only the blocks.
"""

from __future__ import annotations

import mmap
import os
from multiprocessing import shared_memory
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

SHM_PREFIX = "fpkv_"
SHM_DIR = "/dev/shm"
HEADER = 64  # bytes before the blocks in a pooled segment
RECV_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class PoolSegment:
    """A segment kept by its exporter for reuse: int64 generation at byte 0 (0 = free), data at HEADER."""

    __slots__ = ("capacity", "header", "shm")

    def __init__(self, shm: shared_memory.SharedMemory, capacity: int) -> None:
        self.shm, self.capacity = shm, capacity
        self.header = np.frombuffer(shm.buf, dtype=np.int64, count=1)

    def drop(self) -> None:
        self.header = None
        unlink_segment(self.shm)


def map_segment(name: str, length: int = 0, populate: bool = False) -> mmap.mmap:
    """Segment `name` mapped (its first `length` bytes; 0: all of it), every page at once with `populate`."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, min(length, size) if length else size, flags=RECV_FLAGS if populate else mmap.MAP_SHARED)
    finally:
        os.close(fd)


def tensor_view(buf, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
    """A zero-copy tensor over `buf` that keeps `buf` exported (hence mapped) while it lives."""
    import torch

    arr = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=offset)
    return torch.from_numpy(arr).view(dtype).view(shape)


def unlink_segment(seg: shared_memory.SharedMemory) -> None:
    """Unlink (the name goes away at once), then close the mapping if nothing views it."""
    try:
        seg.unlink()
    except FileNotFoundError:
        pass
    close_segment(seg)


def close_segment(seg: shared_memory.SharedMemory) -> None:
    try:
        seg.close()
    except BufferError:
        # a tensor still views the mapping (e.g. one held by a traceback): leave it mapped, the
        # name is already gone so nothing leaks in /dev/shm; it is unmapped when the views die
        pass


def segment_generation(name: str) -> int:
    """A pooled segment's current generation (0: free); FileNotFoundError once unlinked."""
    buf = map_segment(name, length=HEADER)
    try:
        return int(np.frombuffer(buf, dtype=np.int64, count=1)[0])
    finally:
        buf.close()


def unlink_segments_of(pid: int) -> list[str]:
    """Unlink the KV segments a dead process created (a worker killed with its pool or mid-export)."""
    names = leftover_segments(pid)
    for n in names:
        try:
            os.unlink(os.path.join(SHM_DIR, n))
        except FileNotFoundError:
            pass
    return names


def leftover_segments(pid: int | None = None) -> list[str]:
    """Names of KV segments now in /dev/shm (of one creator pid, or all): for leak checks."""
    if not os.path.isdir(SHM_DIR):
        return []
    prefix = SHM_PREFIX if pid is None else f"{SHM_PREFIX}{pid}_"
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
