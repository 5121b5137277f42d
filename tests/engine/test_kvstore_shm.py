"""The node-shared KV store: blocks by hash seen by every process that maps it, bounded LRU, a
checksum that refuses damaged bytes, and a store that stays consistent when a writer is killed."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid

import numpy as np
import pytest

from fluidpd.engine.kvstore.shm import SharedKVStore, default_dir, slots_for

BLOCK = 4096


@pytest.fixture
def path():
    p = default_dir() / f"fluidpd-test-kv-{uuid.uuid4().hex[:8]}"
    yield p
    SharedKVStore.unlink(p)


def _blocks(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, BLOCK), dtype=np.uint8)


def _put(store: SharedKVStore, hashes: list[int], data: np.ndarray) -> int:
    def fill(i: int, out: np.ndarray) -> None:
        out[:] = data[i]

    return store.put(hashes, fill)


def _get(store: SharedKVStore, hashes: list[int]) -> tuple[int, list[np.ndarray]]:
    dest = [np.zeros(BLOCK, np.uint8) for _ in hashes]
    return store.get(hashes, dest), dest


def test_blocks_written_by_one_handle_are_read_by_another(path):
    a, b = SharedKVStore(path, 1 << 20, BLOCK, "m"), SharedKVStore(path, 1 << 20, BLOCK, "m")
    data = _blocks(5)
    assert _put(a, [11, 12, 13, 14, 15], data) == 5
    assert _put(a, [11, 12], data) == 0  # already there: refreshed, not written again
    n, dest = _get(b, [11, 12, 13, 99, 15])
    assert n == 3 and all((dest[i] == data[i]).all() for i in range(3))  # the run stops at the first miss
    assert b.match([11, 12, 13, 14, 15]) == 5 and b.match([99, 11]) == 0
    assert a.stats.offloaded_blocks == 5 and b.stats.loaded_blocks == 3
    a.close()
    b.close()


def test_the_store_is_bounded_and_evicts_the_least_recently_used(path):
    size = 2 * 4096 + 4 * (BLOCK + 48)
    s = SharedKVStore(path, size, BLOCK, "m")
    assert s.num_slots == slots_for(size, BLOCK) == 4
    data = _blocks(6)
    _put(s, [1, 2, 3, 4], data)
    assert _get(s, [1])[0] == 1  # a load makes 1 the most recent
    _put(s, [5, 6], data[4:])
    assert len(s) == 4 and s.stats.evicted_blocks == 2
    assert 2 not in s and 3 not in s and all(h in s for h in (1, 4, 5, 6))
    assert len(s.stats.idle_before_evict_s) == 2 and len(s.stats.reuse_gaps_s) == 1
    # more blocks than the store holds: the most recent (last named) are the ones kept
    assert _put(s, [7, 8, 9, 10, 11, 12], _blocks(6, 1)) == 4 and all(h in s for h in (9, 10, 11, 12))
    s.close()


def test_a_damaged_block_fails_its_checksum_and_is_not_served(path):
    s = SharedKVStore(path, 1 << 20, BLOCK, "m")
    _put(s, [1, 2, 3], _blocks(3))
    slot = s._slots_of([2])[2]
    s._data[slot, 100] ^= 0xFF  # a bit flip in host memory
    n, _ = _get(s, [1, 2, 3])
    assert n == 1 and s.stats.checksum_failures == 1
    s.close()


def test_a_store_serves_only_one_layout(path):
    SharedKVStore(path, 1 << 20, BLOCK, "model-a").close()
    with pytest.raises(ValueError, match="another layout"):
        SharedKVStore(path, 1 << 20, BLOCK, "model-b")
    with pytest.raises(ValueError, match="another layout"):
        SharedKVStore(path, 1 << 20, 2 * BLOCK, "model-a")
    tiny = default_dir() / f"fluidpd-test-kv-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match="cannot hold one"):
        SharedKVStore(tiny, 100, BLOCK, "m")
    assert not tiny.exists()  # a store that could not be made leaves no file


def _writer(path: str, ready) -> None:
    s = SharedKVStore(path, 1 << 20, BLOCK, "m")
    rng = np.random.default_rng(os.getpid())
    ready.set()
    h = 1000
    while True:  # write forever, until killed (possibly mid-copy)
        data = rng.integers(0, 256, (8, BLOCK), dtype=np.uint8)

        def fill(i: int, out: np.ndarray, data=data) -> None:
            for k in range(0, BLOCK, 512):  # a slow copy: the kill most likely lands inside one
                out[k : k + 512] = data[i, k : k + 512]
                time.sleep(0.001)

        s.put(list(range(h, h + 8)), fill)
        h += 8


def test_a_writer_killed_mid_write_leaves_the_store_consistent(path):
    s = SharedKVStore(path, 1 << 20, BLOCK, "m")
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_writer, args=(str(path), ready), daemon=True)
    p.start()
    assert ready.wait(120)
    deadline = time.monotonic() + 60
    while s.stats.capacity_blocks and len(s) < s.num_slots and time.monotonic() < deadline:
        time.sleep(0.01)  # until the store is full: every later write evicts, then overwrites a slot
    time.sleep(0.2)  # into the overwrites
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    e = s._entries
    ready_slots = np.flatnonzero(e[:, 5] == 1)
    hashes = e[ready_slots, 0].tolist()
    n, _ = _get(s, hashes[:1])
    assert n == 1
    assert s.stats.checksum_failures == 0
    for h in hashes:  # every published block is whole: it loads and passes its checksum
        assert _get(s, [h])[0] == 1, h
    assert s.stats.checksum_failures == 0
    # the lock died with the writer, and a slot it left half-written is reused first
    assert _put(s, [1, 2], _blocks(2)) == 2 and s.match([1, 2]) == 2
    assert np.count_nonzero(e[:, 1] % 2) == 0  # no slot is left mid-write after that
    s.close()
