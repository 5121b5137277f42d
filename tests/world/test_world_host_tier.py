"""The host-DRAM KV tier: a request's full blocks are written through to it by hash when it releases
them, a later request whose device prefix ends where the tier holds the next blocks loads them back
(a hit), and a node's pool outlives its workers."""

from __future__ import annotations

import pytest
from tinyworld import TinyWorld

from fluidpd.core.request import Request
from fluidpd.world.host_tier import HostTier


def test_the_tier_is_an_lru_of_hashes_and_matches_a_run_after_the_device_prefix():
    t = HostTier(4)
    assert t.offload([1, 2, 3]) == 3 and t.offload([3]) == 0  # already here: refreshed only
    assert t.offload([4, 5]) == 2 and list(t.lru) == [2, 3, 4, 5] and t.evicted_blocks == 1
    assert t.match([1, 2, 3, 9], 0, 4) == 0  # block 1 is gone
    assert t.match([1, 2, 3, 9], 1, 4) == 2  # the device holds block 1: blocks 2, 3 follow here
    assert t.match([1, 2, 3, 4], 1, 2) == 1  # never past the limit
    t.load([2])
    assert list(t.lru)[-1] == 2 and t.loaded_blocks == 1
    with pytest.raises(ValueError):
        HostTier(0)


def test_store_only_reused_writes_a_block_the_second_time_it_is_released():
    t = HostTier(8, reused_only=True)
    assert t.offload([1, 2]) == 0 and not len(t)
    assert t.offload([2, 3]) == 1 and list(t.lru) == [2]


def test_a_replacement_keeps_the_nodes_pool_and_gets_an_empty_tier_of_its_own():
    own, pool = HostTier(4), HostTier(4, pooled=True)
    own.offload([1])
    pool.offload([1])
    assert own.fresh() is not own and not len(own.fresh()) and own.fresh().capacity_blocks == 4
    assert pool.fresh() is pool


def turn(rid: int, t: float, prompt: int, hashes, output: int = 16) -> Request:
    return Request(rid, t, prompt, output, block_hashes=list(hashes))


def test_an_evicted_prefix_is_loaded_back_from_the_host_tier():
    """Turn 1 leaves 6 cached blocks; a stranger's prompt evicts them from the 8-block arena; turn 2
    finds them in the host tier (without it: a miss), loads them and counts a host hit."""
    results = {}
    for tier in (False, True):
        world = TinyWorld("colocated", 1, kv_blocks=8)
        w = world.workers[0]
        w.host = HostTier(64) if tier else None
        first = turn(0, 0.0, 96, range(7))  # 96 prompt + 16 output: 7 full blocks, 6 of the prompt
        other = turn(1, 1.0, 100, range(100, 107))
        second = turn(2, 2.0, 110, [*range(6), 200])
        world.arrive([first, other, second])
        world.run()
        assert sorted(world.ended) == [0, 1, 2] and w.kv_blocks_used == 0 and not w.cache.refs
        results[tier] = (second.cached_tokens, w.host_hits)
        if tier:
            assert w.host.loaded_blocks == 6 and w.host.offloaded_blocks >= 6
    assert results[False] == (0, 0)
    assert results[True] == (96, 96)  # all 6 blocks (the prompt's last token is computed)


def test_a_block_one_worker_offloaded_to_the_node_pool_is_a_hit_on_another():
    from fluidpd.policy.view import Role
    from fluidpd.world.worker import WorkerState

    pool = HostTier(64, pooled=True)
    a, b = (WorkerState(i, Role.DECODE, 0, kv_blocks=8) for i in range(2))
    a.host = b.host = pool
    req = turn(0, 0.0, 96, range(7))
    a.allocate(7)
    a.register(req, 112)
    a.release(req, blocks=7, tokens=112)  # its 7 blocks stay cached on a, evictable, and go to the pool
    again = turn(1, 1.0, 110, [*range(6), 99])
    assert list(pool.lru) == [6, 5, 4, 3, 2, 1, 0]  # tail first: the prefix's start is the most recent
    assert a.cached_blocks(again) == (6, 0) and b.cached_blocks(again) == (0, 6)
    a.allocate(8)  # a stranger's KV evicts a's cache
    assert a.cached_blocks(again) == (0, 6)
    assert b.take_cached(again) == (96, 6) and b.kv_blocks_used == 6  # 6 blocks loaded from the pool
