"""The prefix cache's block pool and block manager, without a model."""

from __future__ import annotations

import pytest

from fluidpd.core.blockhash import block_hashes
from fluidpd.engine.block_manager import BlockManager, NoFreeBlocksError
from fluidpd.engine.block_pool import BlockPool
from fluidpd.engine.sampling import SamplingParams
from fluidpd.engine.scheduler import Scheduler
from fluidpd.engine.sequence import Sequence

BS = 4


def seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SamplingParams(max_tokens=100))


def computed(bm: BlockManager, s: Sequence, n: int) -> Sequence:
    """`s` with its first `n` tokens computed in blocks of `bm` (as after a step)."""
    bm.reserve([(s, n, bm.lookup(s))])
    s.num_computed = n
    bm.register(s)
    return s


def test_pool_prefers_plain_low_ids_then_evicts_least_recent():
    pool = BlockPool(6)
    a = pool.get(4)
    assert a == [0, 1, 2, 3]
    for b, h in zip(a[:3], (10, 11, 12)):
        assert pool.cache(b, h)
    assert not pool.cache(3, 10)  # a hash is indexed once
    pool.release([2, 1, 0, 3])
    assert pool.num_free == 6 and pool.num_evictable == 3 and pool.num_cached == 3
    assert pool.get(3) == [3, 4, 5]  # plain ids first, lowest first
    assert pool.get(2) == [2, 1]  # then cached ones, least recently released first
    assert pool.lookup([10, 11, 12]) == [0] and pool.num_cached == 1
    pool.share([0])  # a hit takes it out of the LRU
    assert pool.num_free == 0 and pool.refs[0] == 1
    with pytest.raises(NoFreeBlocksError):
        pool.get(1)


def test_full_blocks_are_shared_and_the_last_token_is_always_computed():
    bm = BlockManager(8, BS, enable_caching=True)
    a = computed(bm, seq(list(range(10)), "a"), 10)
    assert a.block_hashes == block_hashes(list(range(10)), BS) and bm.num_cached == 2
    b = seq(list(range(9)), "b")
    assert bm.lookup(b) == a.block_table[:2]  # 9 tokens: two full blocks, the 9th computed
    c = seq(list(range(8)), "c")
    assert bm.lookup(c) == a.block_table[:2]  # an exact multiple: every block (reserve copies the last)
    bm.reserve([(b, 9, bm.lookup(b))])
    assert b.num_computed == 8 and b.block_table[:2] == a.block_table[:2] and len(b.block_table) == 3
    assert bm.num_used == 4  # 3 of a + 1 new of b: shared, never copied
    assert bm.lookup_tokens(list(range(12))) == a.block_table[:2]
    assert bm.lookup_tokens([99, *range(1, 12)]) == []


def test_a_whole_block_aligned_hit_copies_its_last_block_and_computes_one_token():
    bm = BlockManager(4, BS, enable_caching=True)
    a = computed(bm, seq(list(range(8)), "a"), 8)
    table = list(a.block_table)
    bm.free(a)
    c = seq(list(range(8)), "c")
    hits = bm.lookup(c)
    assert hits == table and bm.shortfall([(c, 8, hits)]) == 3  # 2 evictable hits + 1 copy
    bm.reserve([(c, 8, hits)])
    assert c.num_computed == 7 and c.block_table[0] == table[0] and c.block_table[1] not in table
    assert bm.copies == [(table[1], c.block_table[1])] and bm.pool.refs[table[1]] == 1  # held until copied
    moved = []
    bm.apply_copies(moved.extend)
    assert moved == [(table[1], c.block_table[1])] and bm.copies == [] and bm.pool.is_evictable(table[1])
    c.num_computed = 8
    bm.register(c)  # its copy is a duplicate: it takes the cached block back, the copy goes plain
    assert c.block_table == table and bm.num_used == 2 and bm.num_evictable == 0 and bm.num_free == 2


def test_a_whole_hit_that_needs_an_evicted_block_for_its_copy_never_evicts_its_source():
    bm = BlockManager(2, BS, enable_caching=True)
    a = computed(bm, seq(list(range(8)), "a"), 8)
    bm.free(a)
    c = seq(list(range(8)), "c")
    assert bm.shortfall([(c, 8, bm.lookup(c))]) == 3 > bm.num_free
    with pytest.raises(NoFreeBlocksError):
        bm.reserve([(c, 8, bm.lookup(c))])
    assert c.block_table == [] and bm.num_evictable == 2


def test_freed_blocks_stay_cached_and_count_as_free_tail_evicted_first():
    bm = BlockManager(4, BS, enable_caching=True)
    a = computed(bm, seq(list(range(12)), "a"), 12)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free == 4 and bm.num_evictable == 3 and bm.num_cached == 3
    other = seq(list(range(100, 108)), "o")
    bm.allocate(other, 8)  # the plain block, then a's tail
    assert other.block_table == [3, table[2]]
    assert bm.lookup(seq(list(range(13)))) == table[:2]  # the head survives


def test_admission_check_counts_hits_that_sit_in_the_evictable_pool():
    bm = BlockManager(3, BS, enable_caching=True)
    a = computed(bm, seq(list(range(8)), "a"), 8)
    bm.free(a)
    b = seq(list(range(9)), "b")
    hits = bm.lookup(b)
    assert len(hits) == 2 and bm.shortfall([(b, 9, hits)]) == 3 and bm.num_free == 3
    big = seq(list(range(13)), "big")  # needs 2 hits + 2 new: one too many
    with pytest.raises(NoFreeBlocksError, match="'big'"):
        bm.reserve([(big, 13, bm.lookup(big))])
    assert big.block_table == [] and big.num_computed == 0 and bm.num_evictable == 2  # nothing taken
    bm.reserve([(b, 9, hits)])
    assert b.num_computed == 8 and bm.num_free == 0


def test_a_block_computed_twice_is_indexed_once():
    bm = BlockManager(8, BS, enable_caching=True)
    a, b = seq(list(range(8)), "a"), seq(list(range(8)), "b")
    for s in (a, b):  # both admitted before either registered
        bm.reserve([(s, 8, [])])
    for s in (a, b):
        s.num_computed = 8
        bm.register(s)
    assert bm.num_cached == 2 and b.block_hashes == a.block_hashes
    assert b.block_table == a.block_table and bm.num_used == 2  # b took a's blocks, its own went back plain
    bm.free(b)
    assert bm.num_evictable == 0 and bm.num_free == 6
    assert bm.lookup(seq(list(range(9)))) == a.block_table


def test_decode_tokens_fill_blocks_that_the_next_turn_hits():
    bm = BlockManager(8, BS, enable_caching=True)
    a = computed(bm, seq(list(range(6)), "a"), 6)
    a.token_ids += [50, 51, 52]  # the answer, computed token by token
    for n in (7, 8):
        bm.allocate(a, n)
        a.num_computed = n
        bm.register(a)
    assert len(a.block_hashes) == 2
    table = list(a.block_table)
    bm.free(a)
    nxt = seq([*range(6), 50, 51, 52, 60, 61], "next")  # previous prompt + answer + new text
    assert bm.lookup(nxt) == table


def test_caching_off_hashes_nothing():
    bm = BlockManager(4, BS, enable_caching=False)
    a = computed(bm, seq(list(range(12)), "a"), 12)
    assert a.block_hashes == [] and bm.num_cached == 0
    bm.free(a)
    assert bm.num_evictable == 0 and bm.lookup(seq(list(range(12)))) == []
    assert bm.allocate(seq([1], "x"), 1) == [0]


def test_resize_drops_cached_blocks_before_moving_live_ones():
    bm = BlockManager(10, BS, enable_caching=True)
    filler = computed(bm, seq(list(range(200, 216)), "f"), 16)  # blocks 0-3, cached
    old = computed(bm, seq(list(range(300, 308)), "old"), 8)  # 4, 5
    live = computed(bm, seq(list(range(400, 408)), "live"), 8)  # 6, 7
    new = computed(bm, seq(list(range(500, 508)), "new"), 8)  # 8, 9
    bm.free(old)
    bm.free(new)  # most recently used
    bm.free(filler)
    moves = bm.resize(4, [live])
    # live 6, 7 need two low ids: the two oldest low cached blocks (filler's tail 3, 2) are evicted;
    # no plain low id is left for the high cached blocks, so they are all dropped
    assert sorted(moves) == [(6, 2), (7, 3)] and live.block_table == [2, 3]
    assert bm.num_blocks == 4 and bm.num_used == 2 and bm.num_cached == 4
    assert bm.lookup(seq(list(range(200, 209)))) == [0, 1]
    assert bm.lookup(seq(list(range(400, 409)))) == [2, 3]
    with pytest.raises(ValueError, match="in use"):
        bm.resize(1, [live])
    assert bm.resize(6, [live]) == [] and bm.num_free == 4


def test_resize_keeps_the_most_recent_high_cached_blocks_that_fit():
    bm = BlockManager(8, BS, enable_caching=True)
    lo = seq(list(range(100, 108)), "lo")
    bm.reserve([(lo, 8, [])])  # 0, 1: plain, freed below
    a = computed(bm, seq(list(range(8)), "a"), 8)  # 2, 3
    b = computed(bm, seq(list(range(10, 18)), "b"), 8)  # 4, 5
    c = computed(bm, seq(list(range(20, 28)), "c"), 8)  # 6, 7
    bm.free(lo)
    bm.free(c)
    bm.free(b)  # b most recent, then c
    moves = bm.resize(4, [a])
    assert sorted(moves) == [(4, 0), (5, 1)]  # b's blocks into the plain low ids
    assert bm.lookup(seq(list(range(10, 19)))) == [0, 1]
    assert bm.lookup(seq(list(range(20, 29)))) == []  # c dropped
    assert bm.num_cached == 4 and bm.num_used == 2 and bm.num_evictable == 2


def test_scheduler_starts_a_request_after_its_cached_prefix():
    bm = BlockManager(8, BS, enable_caching=True)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    bm.free(computed(bm, seq(list(range(10)), "a"), 10))
    b = seq([*range(8), 70, 71, 72], "b")
    sch.add(b)
    plan = sch.schedule()
    assert [(p.request_id, p.num_tokens, p.num_cached) for p in plan.prefills] == [("b", 3, 0)]
    assert b.num_computed == 8 and len(b.block_table) == 3 and bm.num_evictable == 0
