"""Block manager, arena, scheduler and decode grouping, without a model."""

from __future__ import annotations

import pytest
import torch

from fluidpd.engine.arena import KVArena
from fluidpd.engine.block_manager import BlockManager, NoFreeBlocksError
from fluidpd.engine.runner import _group_decodes
from fluidpd.engine.sampling import SamplingParams
from fluidpd.engine.scheduler import Scheduler
from fluidpd.engine.sequence import Sequence, SequenceStatus


def seq(n_prompt: int, rid: str = "r", n_out: int = 0, computed: int = 0) -> Sequence:
    s = Sequence(rid, list(range(n_prompt + n_out)), n_prompt, SamplingParams(max_tokens=100))
    s.num_computed = computed
    return s


def test_block_manager_allocate_free_lowest_first():
    bm = BlockManager(8, 4, enable_caching=False)
    a, b = seq(5, "a"), seq(9, "b")
    assert bm.allocate(a, 5) == [0, 1] and bm.allocate(b, 9) == [2, 3, 4]
    assert bm.allocate(a, 8) == [] and bm.allocate(a, 9) == [5]
    assert bm.num_free == 2 and bm.needed(b, 20) == 2
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(b, 21)
    bm.free(a)
    assert a.block_table == [] and bm.num_free == 5
    assert bm.allocate(seq(1, "c"), 1) == [0]


def test_block_manager_resize_moves_high_blocks():
    bm = BlockManager(10, 4, enable_caching=False)
    filler, live = seq(16, "f"), seq(12, "l")
    bm.allocate(filler, 16)
    bm.allocate(live, 12)  # [4, 5, 6]
    bm.free(filler)
    moves = bm.resize(5, [live])
    assert sorted(moves) == [(5, 0), (6, 1)] and live.block_table == [4, 0, 1]
    assert bm.num_blocks == 5 and bm.num_free == 2
    with pytest.raises(ValueError, match="in use"):
        bm.resize(2, [live])
    assert bm.resize(12, [live]) == [] and bm.num_free == 9
    assert sorted(bm.allocate(seq(40, "x"), 36)) == [2, 3, 5, 6, 7, 8, 9, 10, 11]


def test_arena_resize_is_in_place_and_keeps_moved_data():
    arena = KVArena(
        num_layers=2,
        num_kv_heads=1,
        head_dim=4,
        block_size=2,
        num_blocks=4,
        total_bytes=4 * 32 * 4 + 256,
        dtype=torch.float32,
        device="cpu",
    )
    assert arena.block_bytes == 2 * 2 * 2 * 4 * 4 and arena.max_blocks == 6
    ptr = arena.buffer.data_ptr()
    arena.kv[3].fill_(7.0)
    arena.resize(2, [(3, 1)])
    assert arena.num_blocks == 2 and bool((arena.kv[1] == 7.0).all())
    assert arena.buffer.data_ptr() == ptr and arena.scratch.numel() == arena.buffer.numel() - 2 * 32
    assert arena.k_layers[1].shape == (2, 2, 1, 4)
    arena.resize(6, [])
    assert arena.scratch.numel() == 0 and arena.kv.shape[0] == 6
    with pytest.raises(ValueError):
        arena.resize(7, [])


def test_arena_gather_uses_scratch_when_it_fits():
    arena = KVArena(
        num_layers=1,
        num_kv_heads=1,
        head_dim=2,
        block_size=2,
        num_blocks=4,
        total_bytes=4 * 8 * 4 + 64,
        dtype=torch.float32,
        device="cpu",
    )
    arena.kv.copy_(torch.arange(32.0).view(arena.kv.shape))
    ids = torch.tensor([2, 0])
    got = arena.gather(arena.k_layers[0], ids, 0)
    assert torch.equal(got, arena.k_layers[0][ids])
    assert got.data_ptr() == arena.scratch.data_ptr()
    arena.resize(6, [])  # no scratch left: allocates
    assert torch.equal(arena.gather(arena.k_layers[0], ids, 1), arena.k_layers[0][ids])


def test_scheduler_budget_chunks_and_admission():
    bm = BlockManager(10, 4, enable_caching=False)
    sch = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=8)
    a, b, c = seq(10, "a"), seq(6, "b"), seq(3, "c")
    for s in (a, b, c):
        sch.add(s)
    plan = sch.schedule()
    assert [(p.request_id, p.num_tokens) for p in plan.prefills] == [("a", 8)]
    assert len(a.block_table) == 3  # whole prompt reserved
    a.num_computed = 8
    plan = sch.schedule()  # a's rest, then b; c over max_num_seqs
    assert [(p.request_id, p.num_tokens) for p in plan.prefills] == [("a", 2), ("b", 6)]
    assert sch.num_running == 2 and sch.num_waiting == 1


def test_scheduler_preempts_newest_when_blocks_run_out():
    bm = BlockManager(4, 4, enable_caching=False)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = seq(8, "a"), seq(8, "b")
    sch.add(a)
    sch.add(b)
    sch.schedule()
    for s in (a, b):  # both decoding, blocks full
        s.num_computed = 8
        s.token_ids.append(1)
    plan = sch.schedule()
    assert plan.decodes == ["a"] and b.status is SequenceStatus.WAITING
    assert b.num_computed == 0 and b.num_preemptions == 1 and list(sch.waiting) == [b]


def test_scheduler_drops_requests_larger_than_the_pool():
    bm = BlockManager(2, 4, enable_caching=False)
    sch = Scheduler(bm, 4, 64)
    big = seq(12, "big")
    sch.add(big)
    assert not sch.schedule() and sch.dropped == [big] and big.finish_reason == "capacity"


def test_decode_grouping_bounds_padding():
    seqs = [seq(1, str(i), computed=c) for i, c in enumerate([10, 12, 15, 400, 410, 2000])]
    groups = _group_decodes(seqs, max_tokens=10_000)
    assert [len(g) for g in groups] == [3, 2, 1]
    assert [len(g) for g in _group_decodes(seqs, max_tokens=1)] == [1] * 6
    assert _group_decodes([], 10) == [] and len(_group_decodes(seqs[:1], 1)) == 1
