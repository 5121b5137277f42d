"""Prefix caching in the lifecycle: a hit is applied at admission by advancing `prefilled`, counted
once per request, and blocks stay cached where their KV was (prefill worker, decode worker)."""

from __future__ import annotations

from tinyworld import TinyWorld, requests

from fluidpd.core.request import Request
from fluidpd.policy.view import Role


class ShapeWorld(TinyWorld):
    """Records every step's prefill chunks as (request id, chunk, attended prior tokens)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.chunks: list[tuple[int, int, int]] = []

    def execute(self, w, plan, shape) -> None:
        self.chunks += [(r.id, c, r.kv_prior) for r, c in plan.chunks]
        super().execute(w, plan, shape)


def turn(rid: int, t: float, prompt: int, hashes, output: int = 20) -> Request:
    return Request(rid, t, prompt, output, block_hashes=list(hashes))


def test_a_repeated_prefix_is_prefilled_once_and_the_rest_attends_over_it():
    first = turn(0, 0.0, 100, range(7))  # context 120 tokens: 7 full blocks, the answer's included
    second = turn(1, 1.0, 150, [*range(7), 50, 51])  # the history, its answer and 30 new tokens
    world = ShapeWorld("colocated", 1, kv_blocks=64)
    world.arrive([first, second])
    world.run()
    assert first.cached_tokens == 0 and second.cached_tokens == 7 * 16
    assert [c for c in world.chunks if c[0] == 1] == [(1, 150 - 112, 112)]  # priced over the cached prefix
    w = world.workers[0]
    assert (w.prefix_cache_queries, w.prefix_cache_hits) == (250, 112)
    assert w.kv_blocks_used == 0 and not w.cache.refs and w.cache.evictable == 9  # the ids known


def test_concurrent_identical_prompts_share_their_blocks_and_a_later_one_hits():
    same = [turn(i, 0.0, 64, range(4), output=30) for i in range(3)] + [turn(3, 1.0, 64, range(4))]
    world = TinyWorld("colocated", 1, kv_blocks=64)  # the kick hook checks every block is counted once
    world.arrive(same)
    world.run(until=0.01)
    w = world.workers[0]
    assert w.cache.refs == {0: 3, 1: 3, 2: 3, 3: 3}
    world.run()
    assert [r.cached_tokens for r in same] == [0, 0, 0, 63]  # the last prompt token is always computed
    assert w.prefix_cache_hits == 63 and w.kv_blocks_used == 0


def hashed(reqs: list[Request], shared: int) -> list[Request]:
    """Give each request `shared` common leading blocks and its own after them."""
    for r in reqs:
        own = (r.prompt_len + r.output_len) // 16 - shared
        r.block_hashes = [*range(shared), *range(1000 * (r.id + 1), 1000 * (r.id + 1) + own)]
    return reqs


def test_a_recompute_after_preemption_is_not_counted_as_a_hit():
    reqs = hashed(requests(12, prompt=60, output=60, gap_s=0.0), shared=2)
    world = TinyWorld("colocated", 1, kv_blocks=24)
    world.arrive(reqs)
    world.run()
    w = world.workers[0]
    assert w.preemptions > 0 and all(r.generated == r.output_len for r in reqs)
    assert w.prefix_cache_queries == sum(r.prompt_len for r in reqs)  # each request looked up once
    assert w.prefix_cache_hits == sum(r.cached_tokens for r in reqs) > 0
    assert w.kv_blocks_used == 0 and not w.cache.refs


def test_handed_off_kv_is_cached_on_the_decode_worker_and_not_counted_as_a_hit():
    first = turn(0, 0.0, 100, range(7))
    world = TinyWorld("static-pd", 2, kv_blocks=64)
    world.arrive([first])
    world.run()
    p, d = world.workers
    assert (p.role, d.role) == (Role.PREFILL, Role.DECODE)
    assert set(p.cache.lru) == set(range(6)) and set(d.cache.lru) == set(range(7))  # prompt / prompt + answer
    assert d.prefix_cache_queries == d.prefix_cache_hits == 0 and p.prefix_cache_hits == 0
    nxt = turn(1, 1.0, 150, [*range(7), 50, 51])
    assert (p.cached_tokens(nxt), d.cached_tokens(nxt)) == (96, 112)


def test_every_policy_ends_cleanly_with_shared_prefixes():
    for policy, workers in [("chunked", 2), ("static-pd", 3), ("fluidtoken", 3), ("fluidpd", 4)]:
        reqs = hashed(requests(40), shared=2)
        world = TinyWorld(policy, workers, kv_blocks=64)
        world.arrive(reqs)
        world.run()
        assert sorted(world.ended) == list(range(40)) and not world.failures
        assert all(w.kv_blocks_used == 0 and not w.cache.refs and not w.cache.held for w in world.workers)
        assert sum(w.prefix_cache_hits for w in world.workers) > 0


def test_a_remap_shrink_evicts_cached_blocks_and_keeps_what_fits():
    reqs = hashed(requests(16, prompt=100, output=40), shared=4)
    late = hashed([Request(99, 1.0, 100, 40)], shared=4)  # keeps the control plane ticking
    world = TinyWorld("fluidpd", 4, kv_blocks=64)
    world.prefill_kv_fraction = 0.25
    world.arrive(reqs + late)
    world.run(until=0.5)
    d = max(world.workers[1:], key=lambda w: w.cache.evictable)
    before = list(d.cache.lru)
    assert d.kv_blocks_used == 0 and len(before) > 16
    world.policy.force_role(d.id, Role.PREFILL, world)
    world.run()
    assert d.role is Role.PREFILL and d.kv_blocks_total == 16
    assert list(d.cache.lru) == before[-16:]  # the most recently used stay
