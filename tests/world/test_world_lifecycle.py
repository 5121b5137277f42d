"""The request lifecycle's invariants on a tiny deterministic world (no latency model, no engine):
every accepted request ends exactly once, with exactly its tokens, and every KV block is freed."""

from __future__ import annotations

import pytest
from tinyworld import TinyWorld, requests

from fluidpd.core.request import Request
from fluidpd.policy.view import Role
from fluidpd.world.events import EventKind

CASES = [
    ("colocated", 1),
    ("colocated", 3),
    ("chunked", 2),
    ("chunked-late-last", 2),
    ("static-pd", 2),
    ("static-pd", 4),
    ("fluidtoken", 3),
    ("fluidpd", 4),
]


def assert_clean(world: TinyWorld, reqs: list[Request]) -> None:
    assert sorted(world.ended) == sorted(r.id for r in reqs)  # each request ended exactly once
    assert world.outstanding == 0
    for w in world.workers:
        assert w.kv_blocks_used == 0 and w.pull_blocks_pending == 0
        assert not (w.queue or w.decoding or w.held or w.pulls or w.incoming or w.busy)
        assert w.num_prefilling == 0 and w.transfers_in == w.transfers_out == 0


@pytest.mark.parametrize("policy,workers", CASES)
def test_every_request_ends_once_with_its_tokens_and_frees_its_kv(policy, workers):
    reqs = requests(40)
    world = TinyWorld(policy, workers, kv_blocks=64)
    world.arrive(reqs)
    world.run()
    assert_clean(world, reqs)
    assert world.metrics.completed == len(reqs) and not world.failures
    for r in reqs:
        assert r.generated == r.output_len and r.gaps == r.output_len - 1
        assert r.first_token_s >= r.arrival_s and r.finish_s >= r.first_token_s


def test_preemption_by_recompute_in_a_small_pool_loses_no_token():
    reqs = requests(12, prompt=60, output=60, gap_s=0.0)
    world = TinyWorld("colocated", 1, kv_blocks=24)
    world.arrive(reqs)
    world.run()
    assert_clean(world, reqs)
    assert world.workers[0].preemptions > 0
    assert all(r.generated == r.output_len for r in reqs)


@pytest.mark.parametrize("policy", ["colocated", "chunked", "chunked-late-last"])
def test_a_restarted_request_that_does_not_fit_never_stalls_a_started_one(policy):
    """A 96-token prompt prefills in two chunks holding 6 of 10 blocks; a request restarted to the
    front of the queue meanwhile needs 6 more: the started one finishes first, then it runs."""
    world = TinyWorld(policy, 1, kv_blocks=10)
    started, restarted = Request(1, 0.0, 96, 4), Request(2, 0.0, 96, 4)
    world.arrive([started])

    def restart(_) -> None:  # as a request whose worker died starts over
        world.outstanding += 1
        world.submit(restarted, front=True)

    world.loop.at(0.001, EventKind.ARRIVAL, restart, None)
    world.run()
    assert_clean(world, [started, restarted])
    assert started.finish_s < restarted.first_token_s
    assert world.workers[0].queue == type(world.workers[0].queue)()


def test_a_request_that_can_never_fit_is_rejected_alone():
    reqs = requests(4)
    reqs.append(Request(99, 0.001, 2000, 10))  # 2010 tokens > 64 blocks x 16
    world = TinyWorld("static-pd", 2, kv_blocks=64)
    world.arrive(reqs)
    world.run()
    assert_clean(world, reqs)
    assert world.metrics.rejected == 1 and world.metrics.completed == 4


@pytest.mark.parametrize("policy,workers", [("colocated", 1), ("chunked", 2), ("static-pd", 3), ("fluidpd", 3)])
@pytest.mark.parametrize("at_token", [0, 5])  # refused at its prefill, or in the middle of its decode
def test_a_refused_request_fails_alone_and_the_rest_complete(policy, workers, at_token):
    reqs = requests(20)
    world = TinyWorld(policy, workers, kv_blocks=64, refuse={3: at_token, 11: at_token})
    world.arrive(reqs)
    world.run()
    assert_clean(world, reqs)
    assert sorted(i for i, _ in world.failures) == [3, 11]
    assert world.metrics.failed == 2 and world.metrics.completed == 18
    assert all(r.generated == r.output_len for r in reqs if r.id not in (3, 11))


def test_drop_takes_a_request_out_of_every_state():
    world = TinyWorld("static-pd", 2, kv_blocks=64)
    reqs = requests(6, prompt=40, output=200)
    world.arrive(reqs)
    world.run(until=0.05)  # some decode, some wait
    p, d = world.workers
    live = [r for r in reqs if not r.finished]
    assert live and any(r.id in d.decoding for r in live)
    for r in live:
        world.drop(r)
        world.outstanding -= 1
    world.run()
    for w in (p, d):
        assert w.kv_blocks_used == 0 and not (w.queue or w.decoding or w.held or w.pulls)


def test_forced_role_switch_migrates_live_requests_without_losing_a_token():
    reqs = requests(30, prompt=40, output=600, gap_s=0.001)  # ~0.7 s of decode: longer than the drain waits
    world = TinyWorld("fluidpd", 4, kv_blocks=512)
    world.arrive(reqs)
    world.run(until=0.02)
    world.policy.force_role(1, Role.PREFILL, world)
    world.run()
    assert_clean(world, reqs)
    (t,) = [t for t in world.policy.transitions if t.reason == "admin"]
    assert t.done and world.workers[1].role is Role.PREFILL
    assert sum(r.migrations for r in reqs) > 0
    assert all(r.generated == r.output_len and r.gaps == r.output_len - 1 for r in reqs)
