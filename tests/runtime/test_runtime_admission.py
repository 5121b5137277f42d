"""Admission control's rule on real worker states: the queue in front of a request sheds it, its own
length never does (but for the operator's hard limit)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest

from fluidpd.core.blockhash import block_hashes
from fluidpd.core.request import Request
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.static_pd import StaticPD
from fluidpd.policy.view import Role
from fluidpd.runtime.admission import QUEUE_FLOOR, TtftEstimate, admit, estimate_ttft, queue_budget_s
from fluidpd.runtime.api import LimitExceeded, Overloaded
from fluidpd.world.worker import WorkerState

S_PER_TOKEN = 0.01  # a linear prefill speed: batching does not change a queue's time
SLO, FACTOR = 5.0, 0.8
LIMIT = SLO * FACTOR


@dataclass
class Cluster:
    """What the estimate reads of a world: its workers, parked requests and policy."""

    workers: list[WorkerState]
    policy: StaticPD = field(default_factory=lambda: StaticPD(PolicyConfig(prefill_batch_tokens=64)))
    parked: deque = field(default_factory=deque)


def cluster(prefill_workers: int = 1) -> Cluster:
    roles = [Role.PREFILL] * prefill_workers + [Role.DECODE]
    return Cluster([WorkerState(i, role, 0, 1000, 16) for i, role in enumerate(roles)])


def request(rid: int, ids: list[int]) -> Request:
    req = Request(rid, 0.0, len(ids), 16)
    req.block_hashes = block_hashes(ids, 16)
    return req


def estimate(c: Cluster, req: Request) -> TtftEstimate:
    return estimate_ttft(c, req, lambda n: S_PER_TOKEN * n)


SYSTEM = list(range(1000, 1800))  # an 800-token system prompt (50 blocks)


def test_an_idle_cluster_predicts_the_prompts_own_prefill_and_no_queue():
    est = estimate(cluster(), request(0, [*SYSTEM, 1, 2, 3]))
    assert est.queue_s == 0 and est.own_s == pytest.approx(S_PER_TOKEN * 803)
    admit(est, SLO, FACTOR)  # 8 s alone, twice the 4 s limit: served best effort, not refused


def test_the_queue_is_the_prompts_ahead_on_the_best_worker():
    c = cluster(prefill_workers=2)
    c.workers[0].enqueue(request(0, list(range(300))))
    c.workers[1].enqueue(request(1, list(range(500, 1100))))
    est = estimate(c, request(2, list(range(2000, 2100))))
    assert est.queue_s == pytest.approx(S_PER_TOKEN * 300) and est.own_s == pytest.approx(S_PER_TOKEN * 100)


def test_prompts_queued_with_one_system_prompt_compute_it_once():
    c = cluster()
    c.workers[0].enqueue(request(0, [*SYSTEM, 7, 8]))
    c.workers[0].enqueue(request(1, [*SYSTEM, 9, 10, 11]))  # queued: computes only its 3 own tokens
    est = estimate(c, request(2, [*SYSTEM, *range(50, 90)]))
    assert est.cached_tokens == len(SYSTEM) and est.own_s == pytest.approx(S_PER_TOKEN * 40)
    assert est.queue_s == pytest.approx(S_PER_TOKEN * (802 + 3))


def test_a_queue_over_the_budget_is_refused_with_the_time_it_takes_to_drain_to_it():
    fits = TtftEstimate(own_s=1.0, queue_s=3.5)  # 4.5 s in all: the queue makes it miss
    with pytest.raises(Overloaded, match=r"adds a predicted 3\.5 s to its 1\.0 s prefill") as e:
        admit(fits, SLO, FACTOR)
    assert e.value.retry_after_s == pytest.approx(3.5 - (LIMIT - 1.0))
    admit(TtftEstimate(1.0, LIMIT - 1.0), SLO, FACTOR)  # exactly at the limit: admitted
    long = TtftEstimate(own_s=10.0, queue_s=QUEUE_FLOOR * LIMIT)  # misses alone: may still queue this long
    admit(long, SLO, FACTOR)
    with pytest.raises(Overloaded):
        admit(TtftEstimate(10.0, QUEUE_FLOOR * LIMIT + 0.1), SLO, FACTOR)
    admit(TtftEstimate(10.0, 100.0), SLO, 0.0)  # factor 0: admission by queue is off


def test_the_budget_shrinks_with_the_own_prefill_down_to_its_floor():
    budgets = [queue_budget_s(own, LIMIT) for own in (0.0, 1.0, 2.0, 3.0, 4.0, 10.0)]
    assert budgets == pytest.approx([4.0, 3.0, 2.0, 2.0, 2.0, 2.0])


def test_no_routable_worker_is_overload_and_the_hard_limit_is_its_own_error():
    c = cluster()
    for w in c.workers:  # (with no prefill worker routable, decode workers take the prompts)
        w.routable = False
    est = estimate(c, request(0, [1, 2, 3]))
    with pytest.raises(Overloaded):
        admit(est, SLO, FACTOR, max_prefill_s=1.0)  # (not LimitExceeded: nothing predicts its prefill)
    with pytest.raises(LimitExceeded, match="over --admit-max-prefill-s 5") as e:
        admit(TtftEstimate(own_s=6.0, queue_s=0.0), SLO, FACTOR, max_prefill_s=5.0)
    assert e.value.code == "prefill_limit_exceeded"
    admit(TtftEstimate(own_s=5.0, queue_s=0.0), SLO, 0.0, max_prefill_s=5.0)


def test_the_estimate_covers_only_the_part_of_the_cluster_the_policy_would_serve_the_request_in():
    class OnlyWorker1(StaticPD):
        def serving_view(self, req, view):  # as fluidpd-pools answers with the pool its router tier picks
            return Cluster([view.workers[1]])

    c = cluster(prefill_workers=2)
    c.workers[1].enqueue(request(0, list(range(300))))
    req = request(1, list(range(5000, 5100)))
    assert estimate(c, req).queue_s == 0  # worker 0 is idle
    c.policy = OnlyWorker1(PolicyConfig(prefill_batch_tokens=64))
    assert estimate(c, req).queue_s == pytest.approx(S_PER_TOKEN * 300)  # only worker 1's queue counts
