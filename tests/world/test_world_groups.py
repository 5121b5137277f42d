"""A request group's KV blocks and decode rows on a WorkerState: the prompt's full blocks once, each live
sequence its own; rows, context and growth buckets count sequences; one sequence may stop early."""

from __future__ import annotations

from fluidpd.core.request import Request
from fluidpd.policy.view import Role
from fluidpd.world.worker import WorkerState

BS = 16


def _worker() -> WorkerState:
    return WorkerState(0, Role.COLOCATED, 0, 1000, BS)


def _prefilled(prompt: int, n: int) -> Request:
    req = Request(1, 0.0, prompt, 50, n=n)
    req.prefilled = req.prefill_target
    req.generated = 1  # the first tokens, out of the prefill
    return req


def test_group_blocks_share_the_prompts_full_blocks():
    w = _worker()
    single, group = _prefilled(40, 1), _prefilled(40, 4)
    assert w.blocks_of(single) == 3  # 40 tokens: 2 full blocks + a partial one
    assert w.blocks_of(group) == 2 + 4 * 1  # the full ones once, a partial one per sequence
    assert w.prefill_blocks(Request(2, 0.0, 40, 50, n=4)) == w.blocks_of(group)  # reserved at admission
    aligned = _prefilled(32, 4)
    assert w.blocks_of(aligned) == 2  # block-aligned: nothing of its own yet
    aligned.generated = 2
    assert w.blocks_of(aligned) == 2 + 4  # each sequence's first block of its own


def test_decode_rows_count_sequences_and_a_stopped_one_frees_its_blocks():
    w = _worker()
    req, other = _prefilled(40, 4), _prefilled(40, 1)
    other.id = 2
    w.allocate(w.blocks_of(req) + w.blocks_of(other))
    w.join(req)
    w.join(other)
    assert len(w.decoding) == 2 and w.decode_rows == w.num_decoding == 5
    assert w.decode_ctx_sum == 5 * 40
    assert sum(w.buckets) == 5
    used = w.kv_blocks_used
    w.busy = True  # the step in which one of its sequences stopped
    w.drop_sequence(req)
    w.busy = False
    assert req.live == 3 and w.decode_rows == 4 and w.decode_ctx_sum == 4 * 40 and sum(w.buckets) == 4
    assert w.kv_blocks_used == used - 1  # its own (partial) block
    assert w.blocks_of(req) == 2 + 3
    w.decode_tick(1.0, 1.0, lambda *a: None)
    assert w.tokens_out == 4 and w.decode_ctx_sum == 4 * 41
    for r in (req, other):
        w.leave(r)
        w.release(r)
    assert w.kv_blocks_used == 0 and w.decode_rows == 0 and w.decode_ctx_sum == 0 and sum(w.buckets) == 0


def test_a_group_restarts_with_each_live_sequences_tokens():
    req = _prefilled(40, 4)
    req.generated, req.live = 5, 3
    req.start_over()
    assert req.prefill_target == 40 + 3 * 5
    single = _prefilled(40, 1)
    single.generated = 5
    single.start_over()
    assert single.prefill_target == 45
