"""KV affinity in the lifecycle: KV moves carry only the blocks the destination lacks, and fluidpd
prefills a follow-up turn on the decode worker that holds its context, moving nothing."""

from __future__ import annotations

from tinyworld import TinyWorld

from fluidpd.core.request import Request
from fluidpd.policy.view import Role


def turn(rid: int, t: float, prompt: int, hashes, output: int = 20) -> Request:
    return Request(rid, t, prompt, output, block_hashes=list(hashes))


def test_a_hand_off_moves_only_the_blocks_the_decode_worker_lacks():
    first = turn(0, 0.0, 100, range(7))  # prompt + answer: 119 stored tokens, 7 full blocks
    world = TinyWorld("static-pd", 2, kv_blocks=64)
    world.arrive([first])
    world.run()
    assert world.kv_tokens_moved == 100  # the whole prompt: the decode worker held nothing
    nxt = turn(1, 1.0, 150, [*range(7), 50, 51])  # the history, its answer and 31 new tokens
    world.arrive([nxt])
    world.run()
    p, d = world.workers
    assert (p.role, d.role) == (Role.PREFILL, Role.DECODE)
    assert nxt.cached_tokens == 96  # the prefill worker held the first prompt's 6 blocks
    assert world.kv_tokens_moved == 100 + (150 - 7 * 16)  # the decode worker held 7 blocks of 150
    assert all(w.kv_blocks_used == 0 and not w.cache.refs for w in world.workers)


def busy_prefill(t: float) -> list[Request]:
    """Prompts that keep the prefill worker's queue long at `t` (nothing of them cached anywhere)."""
    return [Request(100 + i, t, 400, 1) for i in range(6)]


def test_fluidpd_prefills_a_follow_up_turn_where_its_context_decoded():
    first = turn(0, 0.0, 100, range(7))
    world = TinyWorld("fluidpd", 3, kv_blocks=256)
    world.arrive([first, *busy_prefill(0.999), turn(1, 1.0, 150, [*range(7), 50, 51])])
    world.run()
    nxt = next(r for r in world.metrics.finished if r.id == 1)
    assert nxt.cached_tokens == 7 * 16  # the decode worker's copy: prompt and answer
    assert world.policy.affinity.on_decode == 1
    assert world.kv_tokens_moved == 100  # only the first turn's hand-off moved KV
    holder = [w for w in world.workers if w.prefix_cache_hits]
    assert len(holder) == 1 and holder[0].role is Role.DECODE


def test_without_kv_affinity_the_follow_up_recomputes_on_a_prefill_worker():
    world = TinyWorld("fluidpd", 3, kv_blocks=256, router="shortest-queue")  # the ablation: load alone
    world.arrive([turn(0, 0.0, 100, range(7)), *busy_prefill(0.999), turn(1, 1.0, 150, [*range(7), 50, 51])])
    world.run()
    nxt = next(r for r in world.metrics.finished if r.id == 1)
    assert nxt.cached_tokens == 96  # the prefill worker's copy lacks the answer
    assert world.kv_tokens_moved > 100
