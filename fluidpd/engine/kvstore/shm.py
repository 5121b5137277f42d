"""A node-shared KV store in shared memory: every worker process of a node maps the same file.

Mooncake Store's and LMCache's local-DRAM tier, on one machine. The file (under /dev/shm) holds a
header, one entry per slot and the slots' block bytes:

    header  [magic, version, block_bytes, num_slots, tick, fingerprint, ...]       4 KiB
    entries [num_slots, 6] int64: hash, seq, checksum, tick, touched_ns, ready
    data    [num_slots, block_bytes] uint8

Writers (put, and the LRU touches of get) hold an exclusive `flock` on the file: the kernel drops it
when a process dies, so a killed writer never blocks the others. Publication is atomic for readers,
who take no lock: a writer clears `ready` and makes `seq` odd before touching a slot's bytes, and sets
the checksum, an even `seq` and `ready` after; a reader copies the bytes, then checks that the entry
still names the same hash with the same even `seq`, and that the copy's CRC-32 matches (a mismatch is
counted and the block recomputed, never served). A writer killed mid-copy leaves its slot unready, and
the next writer reuses it first. Eviction: the ready slot with the lowest tick (least recently
written or loaded). Stores on x86-64 are seen in program order by other cores (TSO), which the
seq/ready protocol relies on.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from hashlib import blake2b
from pathlib import Path

import numpy as np

from fluidpd.engine.kvstore.base import KVStore, StoreStats

MAGIC = 0x46504B5653544F52  # "FPKVSTOR"
VERSION = 1
HEADER_BYTES = 4096
HASH, SEQ, CRC, TICK, TOUCHED, READY = range(6)
ENTRY = 6
H_MAGIC, H_VERSION, H_BLOCK, H_SLOTS, H_TICK, H_FINGERPRINT = range(6)


def default_dir() -> Path:
    """Where a node's stores live: /dev/shm (RAM) where the OS has it, else the temp directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))


def fingerprint(layout: str) -> int:
    """A signed 64-bit name of a KV layout: a store serves only engines of one model and layout."""
    return int.from_bytes(blake2b(layout.encode(), digest_size=8).digest(), "little", signed=True)


def slots_for(size_bytes: int, block_bytes: int) -> int:
    """Blocks a store of `size_bytes` (header and entries included) holds."""
    return max(0, (size_bytes - 2 * HEADER_BYTES) // (block_bytes + ENTRY * 8))


class SharedKVStore(KVStore):
    """A bounded, LRU, crash-consistent block store in a shared-memory file, one per node. The first
    process to open `path` creates it with `size_bytes`; the others attach to it as it is."""

    def __init__(self, path: str | os.PathLike, size_bytes: int, block_bytes: int, layout: str = "") -> None:
        self.path, self.block_bytes = Path(path), block_bytes
        slots = slots_for(size_bytes, block_bytes)
        self._tlock = threading.Lock()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with self._locked():
                if os.fstat(self._fd).st_size == 0:
                    if slots < 1:
                        os.unlink(self.path)  # created just now, empty: leave nothing behind
                        raise ValueError(f"a KV store of {size_bytes} bytes cannot hold one {block_bytes}-byte block")
                    os.ftruncate(self._fd, _total(slots, block_bytes))
                    self._map(slots)
                    self._header[:6] = [MAGIC, VERSION, block_bytes, slots, 0, fingerprint(layout)]
                else:
                    self._attach(block_bytes, layout)
        except BaseException:
            os.close(self._fd)
            raise
        self.stats = StoreStats(capacity_blocks=self.num_slots, block_bytes=block_bytes)

    def _map(self, slots: int) -> None:
        self.num_slots = slots
        self._mm = mmap.mmap(self._fd, _total(slots, self.block_bytes))
        self._header = np.frombuffer(self._mm, np.int64, HEADER_BYTES // 8)
        self._entries = np.frombuffer(self._mm, np.int64, slots * ENTRY, HEADER_BYTES).reshape(slots, ENTRY)
        self._data = np.frombuffer(self._mm, np.uint8, slots * self.block_bytes, _data_offset(slots)).reshape(
            slots, self.block_bytes
        )

    def _attach(self, block_bytes: int, layout: str) -> None:
        head = np.frombuffer(os.pread(self._fd, 48, 0), np.int64)
        if head[H_MAGIC] != MAGIC or head[H_VERSION] != VERSION:
            raise ValueError(f"{self.path} is not a fluidpd KV store (or one of another version)")
        if head[H_BLOCK] != block_bytes or head[H_FINGERPRINT] != fingerprint(layout):
            raise ValueError(
                f"the KV store {self.path} holds blocks of another layout ({int(head[H_BLOCK])} bytes, "
                f"not {block_bytes}): one store serves one model"
            )
        self._map(int(head[H_SLOTS]))

    @contextmanager
    def _locked(self):
        with self._tlock:  # flock excludes processes, not threads sharing this descriptor
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ reads
    def _slots_of(self, hashes: Sequence[int]) -> dict[int, int]:
        """hash -> slot for the ready slots naming one of `hashes` (a racy snapshot: readers re-check)."""
        e = self._entries
        idx = np.flatnonzero(np.isin(e[:, HASH], np.asarray(hashes, dtype=np.int64)) & (e[:, READY] == 1))
        return dict(zip(e[idx, HASH].tolist(), idx.tolist()))

    def __len__(self) -> int:
        return int(np.count_nonzero(self._entries[:, READY] == 1))

    def __contains__(self, h: int) -> bool:
        return h in self._slots_of([h])

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading `hashes` the store holds now (no side effects)."""
        where = self._slots_of(hashes)
        return next((i for i, h in enumerate(hashes) if h not in where), len(hashes))

    def get(self, hashes: Sequence[int], dest: Sequence[np.ndarray]) -> int:
        t0 = time.perf_counter()
        where, e, n = self._slots_of(hashes), self._entries, 0
        for h, out in zip(hashes, dest):
            s = where.get(h)
            if s is None:
                break
            seq = int(e[s, SEQ])
            if seq & 1:
                break
            np.copyto(out, self._data[s])
            if e[s, SEQ] != seq or e[s, HASH] != h or e[s, READY] != 1:
                break  # overwritten while we read: a miss
            if zlib.crc32(out) != e[s, CRC]:
                self.stats.checksum_failures += 1
                break
            n += 1
        if n:
            self._touch([where[h] for h in hashes[:n]], hashes[:n])
            self.stats.loaded_blocks += n
            self.stats.loaded_bytes += n * self.block_bytes
            self.stats.load_s += time.perf_counter() - t0
        return n

    def _touch(self, slots: list[int], hashes: Sequence[int]) -> None:
        e, now = self._entries, time.monotonic_ns()
        with self._locked():
            tick = int(self._header[H_TICK])
            for s, h in zip(slots, hashes):
                if e[s, HASH] == h and e[s, READY] == 1:
                    self.stats.reuse_gaps_s.append((now - int(e[s, TOUCHED])) / 1e9)
                    tick += 1
                    e[s, TICK], e[s, TOUCHED] = tick, now
            self._header[H_TICK] = tick

    # ------------------------------------------------------------------ writes
    def put(self, hashes: Sequence[int], fill: Callable[[int, np.ndarray], None]) -> int:
        t0 = time.perf_counter()
        skip = max(0, len(hashes) - self.num_slots)  # more than fit: the most recent ones
        e, data, now = self._entries, self._data, time.monotonic_ns()
        written = 0
        first: dict[int, int] = {}  # hash -> its first index in `hashes`
        for i in range(skip, len(hashes)):
            first.setdefault(hashes[i], i)
        with self._locked():
            slot_of = self._slots_of(list(first))
            tick = int(self._header[H_TICK])
            new = [h for h in first if h not in slot_of]
            for h, s in zip(new, self._victims(len(new), set(slot_of.values()))):
                if e[s, READY] == 1:
                    self.stats.evicted_blocks += 1
                    self.stats.idle_before_evict_s.append((now - int(e[s, TOUCHED])) / 1e9)
                e[s, READY] = 0
                e[s, SEQ] += 1 - e[s, SEQ] % 2  # odd: being written (a killed writer's slot is odd already)
                e[s, HASH] = h
                fill(first[h], data[s])
                e[s, CRC] = zlib.crc32(data[s])
                e[s, SEQ] += 1
                e[s, READY] = 1
                slot_of[h] = s
                written += 1
            for h in first:  # in order: the last named is the most recent
                tick += 1
                s = slot_of[h]
                e[s, TICK], e[s, TOUCHED] = tick, now
            self._header[H_TICK] = tick
            self.stats.offloaded_blocks += written
            self.stats.offloaded_bytes += written * self.block_bytes
            self.stats.offload_s += time.perf_counter() - t0
        return written

    def _victims(self, k: int, keep: set[int]) -> list[int]:
        """`k` slots to write, least valuable first: unready ones (empty, or a killed writer's), then
        the least recently used; never one of `keep`."""
        if not k:
            return []
        e = self._entries
        key = np.where(e[:, READY] == 1, e[:, TICK], -1)
        if keep:
            key[list(keep)] = np.iinfo(np.int64).max
        idx = np.argpartition(key, k - 1)[:k] if k < len(key) else np.arange(len(key))
        return idx[np.argsort(key[idx], kind="stable")].tolist()

    # ------------------------------------------------------------------ life
    def report(self) -> StoreStats:
        """A copy of this process's counters and the store's occupancy now, with the residency samples
        gathered since the last report (taken out)."""
        with self._tlock:
            self.stats.used_blocks = len(self)
            out = replace(self.stats)
            self.stats.reuse_gaps_s, self.stats.idle_before_evict_s = [], []
        return out

    def close(self) -> None:
        if self._fd < 0:
            return
        del self._header, self._entries, self._data
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view: the map goes when that view does
            pass
        os.close(self._fd)
        self._fd = -1

    @staticmethod
    def unlink(path: str | os.PathLike) -> None:
        """Remove a node's store file (processes that have it mapped keep their view until they close)."""
        Path(path).unlink(missing_ok=True)


def _data_offset(slots: int) -> int:
    return -(-(HEADER_BYTES + slots * ENTRY * 8) // HEADER_BYTES) * HEADER_BYTES


def _total(slots: int, block_bytes: int) -> int:
    return _data_offset(slots) + slots * block_bytes
