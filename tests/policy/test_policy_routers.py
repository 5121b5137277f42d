"""The routers by name, each on real simulator workers whose caches hold known blocks."""

from __future__ import annotations

import pytest

from fluidpd.core.request import Request
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.registry import make_policy
from fluidpd.policy.routers import ROUTERS, make_router
from fluidpd.policy.view import Role
from fluidpd.world.worker import WorkerState


def worker(wid: int, blocks: int = 100) -> WorkerState:
    return WorkerState(wid, Role.COLOCATED, 0, blocks, 16)


def cache(w: WorkerState, hashes) -> None:
    """Leave `hashes` cached (evictable) on `w`, as a finished request would."""
    r = Request(10_000 + w.id, 0.0, 16 * len(hashes) + 1, 1, block_hashes=list(hashes))
    w.allocate(len(hashes))
    w.register(r, 16 * len(hashes))
    w.release(r, len(hashes), 16 * len(hashes))


def busy(w: WorkerState, n: int, tokens: int = 16) -> None:
    for i in range(n):
        w.enqueue(Request(1000 * (w.id + 1) + i, 0.0, tokens, 1))


def new(hashes, prompt: int = 16 * 8 + 1) -> Request:
    return Request(1, 0.0, prompt, 8, block_hashes=list(hashes))


def test_every_router_is_built_by_name_and_an_unknown_one_is_a_clear_error():
    assert {"round-robin", "shortest-queue", "sglang-cache-aware", "dynamo-kv", "llm-d"} <= set(ROUTERS)
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        make_policy("chunked", PolicyConfig(router="nope"))
    with pytest.raises(ValueError, match="unknown router 'kv-affinity'"):  # fluidpd's own, priced by its costs
        make_policy("static-pd", PolicyConfig(router="kv-affinity"))
    assert make_policy("static-pd", PolicyConfig(router="llm-d")).label == "static-pd+llm-d"


def test_round_robin_takes_turns():
    ws = [worker(i) for i in range(3)]
    rr = make_router("round-robin")
    assert [rr.pick(new([]), ws, None).id for _ in range(4)] == [0, 1, 2, 0]


def test_sglang_goes_to_the_best_match_above_its_threshold_else_the_smallest_cache():
    a, b, c = worker(0), worker(1), worker(2)
    cache(a, range(6))
    cache(b, [*range(2), 90, 91, 92, 93, 94])
    r = make_router("sglang-cache-aware")
    assert r.pick(new(range(8)), [a, b, c], None) is a  # 96 of 129 tokens cached on a: above 0.5
    assert r.pick(new([0, 1, 50, 51, 52, 53, 54, 55]), [a, b, c], None) is c  # 32 of 129: the smallest cache
    busy(a, 40)  # imbalance past 32 outstanding requests: shortest queue, cache or not
    assert r.pick(new(range(8)), [a, b, c], None) in (b, c)


def test_sglang_sends_equal_matches_to_the_least_loaded():
    """A prefix every worker holds (or a node's pooled host tier) ties the match: the least loaded takes
    it, not always the lowest id (which piled a pooled tier's hits onto worker 0)."""
    a, b, c = worker(0), worker(1), worker(2)
    for w in (a, b, c):
        cache(w, range(6))
    busy(a, 3)
    busy(c, 1)
    r = make_router("sglang-cache-aware")
    assert r.pick(new(range(8)), [a, b, c], None) is b


def test_dynamo_weighs_prefill_blocks_against_active_blocks():
    a, b = worker(0), worker(1)
    cache(a, range(6))
    r = make_router("dynamo-kv")
    assert r.pick(new(range(8)), [a, b], None) is a  # 6 fewer blocks to prefill
    b_free_of_load = r.pick(new(range(8)), [a, b], None)
    busy(a, 1, tokens=16 * 7)  # 7 queued blocks to prefill outweigh the 6 cached
    assert b_free_of_load is a and r.pick(new(range(8)), [a, b], None) is b


def test_llmd_scores_prefix_twice_kv_and_queue_once():
    a, b = worker(0), worker(1)
    cache(a, range(8))
    r = make_router("llm-d")
    assert r.pick(new(range(8)), [a, b], None) is a  # prefix 2 x 1.0 beats the queue's tie
    busy(a, 3)
    assert r.pick(new(range(8)), [a, b], None) is a  # prefix 2 > queue 1 + kv
    cache(b, range(5))
    assert r.pick(new(range(8)), [a, b], None) is b  # 2 x 5/8 + queue 1 + kv 1 > 2 x 1 + queue 0 + kv 1


def test_cache_affinity_ignores_load():
    a, b = worker(0), worker(1)
    cache(a, range(3))
    busy(a, 50)
    assert make_router("cache-affinity").pick(new(range(8)), [a, b], None) is a
    assert make_router("least-loaded").pick(new(range(8)), [a, b], None) is b


def offloaded(w: WorkerState, hashes) -> None:
    """`hashes` in `w`'s host tier only (evicted from its arena)."""
    from fluidpd.world.host_tier import HostTier

    w.host = w.host or HostTier(64)
    w.host.offload(list(hashes))


def test_the_baseline_routers_weigh_a_host_tier_hit_as_their_systems_do():
    """8 blocks in a's host tier against 7 on b's device: Dynamo (host 0.75: 6 blocks) and llm-d (cpu 0.8:
    6.4) prefer b; a tier weighed as the device (8 blocks) would have taken a."""
    for name in ("dynamo-kv", "llm-d"):
        a, b = worker(0), worker(1)
        offloaded(a, range(8))
        cache(b, range(7))
        req = new(range(8), prompt=16 * 8 + 1)
        assert a.cached_blocks(req) == (0, 8) and b.cached_blocks(req) == (7, 0)
        assert make_router(name).pick(req, [a, b], None) is b, name
        c = worker(2)
        offloaded(c, range(8))
        assert make_router(name).pick(req, [c, worker(3)], None) is c, name  # a host hit still beats none


def test_kv_affinity_counts_a_host_hit_only_where_loading_beats_recomputing():
    from types import SimpleNamespace

    from fluidpd.core.polynomial import Polynomial
    from fluidpd.policy.fluidtoken import FluidToken
    from fluidpd.policy.routers.kv_affinity import KvAffinity

    w = SimpleNamespace(block_size=16, cached_blocks=lambda req: (2, 6))
    token = FluidToken(Polynomial((1e-5, 0.0)), 0.05)
    fast = KvAffinity(lambda t: 1e-4 * t, lambda: 512, token, load_s_per_token=1e-6)
    slow = KvAffinity(lambda t: 1e-4 * t, lambda: 512, token, load_s_per_token=1e-3)
    assert fast.hit(w, new(range(8))) == (128, pytest.approx(96e-6))  # 96 host tokens at 1 us each
    assert slow.hit(w, new(range(8))) == (32, 0.0)  # 96 ms to load 9.6 ms of prefill: recompute


def test_kv_affinity_prices_a_long_prompt_on_the_decode_worker_with_its_growing_attention():
    """Chunks on a decode worker attend to every earlier token of their prompt: a long new prompt that
    shares only a prefix every worker holds costs more there than one pass on an idle prefill worker."""
    from types import SimpleNamespace

    from fluidpd.core.polynomial import Polynomial
    from fluidpd.policy.fluidtoken import FluidToken
    from fluidpd.policy.routers.kv_affinity import KvAffinity

    token = FluidToken(Polynomial((1e-5, 0.0)), 0.05, attn_pair_s=1e-8)
    router = KvAffinity(lambda t: 1e-5 * t, lambda: 512, token)
    p, d = WorkerState(0, Role.PREFILL, 0, 1000, 16), WorkerState(1, Role.DECODE, 0, 1000, 16)
    for w in (p, d):
        cache(w, range(2))
    req = new(range(2), prompt=16 * 600 + 1)
    hit, end, most = 32, req.prefill_target, token.config.max_chunk
    # each token attends to at least every token before its chunk (a chunk holds at most max_chunk)
    pairs = (end - hit) * (end + hit) / 2 - (end - hit) * most / 2
    assert router.on_decode_s(req, d, hit) >= 1e-5 * (end - hit) + 1e-8 * pairs
    assert router.route(req, SimpleNamespace(workers=[p, d])) == p.id
