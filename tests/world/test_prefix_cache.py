"""The per-worker prefix cache: reference counts, sharing, the LRU of evictable blocks, capacity."""

from __future__ import annotations

import pytest

from fluidpd.core.request import Request
from fluidpd.policy.view import Role
from fluidpd.world.prefix_cache import PrefixCache
from fluidpd.world.worker import WorkerState


def req(rid: int, prompt: int, hashes, output: int = 4) -> Request:
    return Request(rid, 0.0, prompt, output, block_hashes=list(hashes))


def test_release_keeps_blocks_evictable_tail_first_and_acquire_revives_them():
    c = PrefixCache()
    assert c.register(1, [10, 11, 12], 3) == 0 and c.refs == {10: 1, 11: 1, 12: 1}
    assert c.release(1, [10, 11, 12], 3) == (3, 3)
    assert not c.refs and list(c.lru) == [12, 11, 10]  # the prefix's end is evicted first
    assert c.match([10, 11, 99, 12], 10) == 2 and c.match([10, 11, 12], 1) == 1
    assert c.acquire(2, [10, 11], 2) == 2 and c.refs == {10: 1, 11: 1} and list(c.lru) == [12]
    c.evict(5)
    assert not c.lru and c.match([10, 11, 12], 3) == 2


def test_a_demoted_release_joins_the_old_end_of_the_lru_tail_first():
    c = PrefixCache()
    c.register(1, [20, 21], 2)
    c.release(1, [20, 21], 2)
    c.register(2, [10, 11, 12], 3)
    c.release(2, [10, 11, 12], 3, demote=True)  # its KV went on elsewhere: evicted before older blocks
    assert list(c.lru) == [12, 11, 10, 21, 20]
    c.evict(3)
    assert list(c.lru) == [21, 20] and 10 not in c and c.match([20, 21], 2) == 2
    c.acquire(3, [20, 21], 2)  # a hit: 20 and 21 are a shared prefix now
    c.register(3, [20, 21, 22], 3)
    c.register(4, [30], 1)
    c.release(4, [30], 1)
    c.release(3, [20, 21, 22], 3, demote=True)
    assert list(c.lru) == [22, 30, 21, 20]  # only its own block is demoted; the shared ones stay recent


def test_shared_blocks_are_counted_once_and_freed_by_their_last_holder():
    c = PrefixCache()
    c.register(1, [10, 11], 2)
    assert c.register(2, [10, 11, 12], 3) == 2  # its copies of 10 and 11 are dropped for the live ones
    assert c.refs == {10: 2, 11: 2, 12: 1}
    assert c.release(1, [10, 11], 2) == (2, 0) and not c.lru
    assert c.release(2, [10, 11, 12], 3) == (3, 3) and list(c.lru) == [12, 11, 10]


def test_a_private_duplicate_of_a_live_block_is_freed_not_cached_twice():
    c = PrefixCache()
    c.register(1, [10, 11], 2)
    assert c.release(2, [10, 11, 12], 3) == (0, 0)  # never registered: 10 and 11 live elsewhere
    assert c.refs == {10: 1, 11: 1} and list(c.lru) == [12]


def worker(blocks: int = 10) -> WorkerState:
    return WorkerState(0, Role.COLOCATED, 0, blocks, block_size=16)


def test_worker_counts_cached_blocks_as_free_and_evicts_lru_for_an_allocation():
    w = worker(10)
    a = req(1, 64, range(4))  # 4 full blocks, stored 64 + 1 - 1 tokens once its first token is out
    w.allocate(4)
    w.register(a, 64)
    a.generated = 1
    w.release(a)
    assert w.kv_blocks_used == 0 and w.free_blocks == 10 and w.cache.evictable == 4
    w.allocate(8)  # needs 2 of the cached blocks' room: the least recently used (the tail) go
    assert w.cache.evictable == 2 and list(w.cache.lru) == [1, 0]
    b = req(2, 100, [0, 1, 2, 3])
    assert w.cached_tokens(b) == 32


def test_cached_tokens_leave_the_last_prompt_token_to_compute():
    w = worker(10)
    a = req(1, 64, range(4))
    w.allocate(4)
    w.register(a, 64)
    assert w.cached_tokens(req(2, 64, range(4))) == 63  # all 4 blocks cached: the last copied, 1 token computed
    assert w.cached_tokens(req(3, 65, range(4))) == 64
    assert w.cached_tokens(req(4, 65, [])) == 0
    assert w.cached_tokens(req(5, 80, [0, 1, 2, 3, 9])) == 64  # its last block not cached: computed


def test_a_whole_hit_holds_all_but_its_last_block_and_allocates_the_copy():
    w = worker(10)
    a = req(1, 64, range(4))
    w.allocate(4)
    w.register(a, 64)
    b = req(2, 64, range(4))
    assert w.take_cached(b) == (63, 0) and w.kv_blocks_used == 4  # 3 shared with a
    w.allocate(1)  # the copy of the last block
    w.register(b, 64)  # a duplicate of a's last block: dropped, b shares a's
    assert w.kv_blocks_used == 4 and w.cache.refs == {0: 2, 1: 2, 2: 2, 3: 2}


def test_take_cached_holds_live_blocks_without_counting_them_twice():
    w = worker(10)
    a, b = req(1, 64, range(4)), req(2, 80, range(5))
    w.allocate(4)
    w.register(a, 64)
    assert w.take_cached(b) == (64, 0) and w.kv_blocks_used == 4  # shared with a
    w.allocate(1)  # b's own block
    w.register(b, 80)
    assert w.cache.refs == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1} and w.kv_blocks_used == 5
    a.generated = b.generated = 1
    w.release(a)
    assert w.kv_blocks_used == 5 and not w.cache.lru
    w.release(b)
    assert w.kv_blocks_used == 0 and w.cache.evictable == 5


def test_resize_evicts_cached_blocks_first_and_keeps_what_fits():
    w = worker(10)
    a, live = req(1, 96, range(6)), req(2, 48, [])
    w.allocate(6)
    w.register(a, 96)
    a.generated = 1
    w.release(a)
    w.allocate(3)  # live KV of another request
    w.resize(5)
    assert w.kv_blocks_total == 5 and w.cache.evictable == 2 and list(w.cache.lru) == [1, 0]
    with pytest.raises(RuntimeError, match="live KV"):
        w.resize(2)
    w.release(live, 3)
    assert w.kv_blocks_used == 0
