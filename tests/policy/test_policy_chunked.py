"""`chunked` and `chunked-late-last`: the same chunked steps, FCFS or with the late ones last."""

from types import SimpleNamespace

import numpy as np
import pytest
from simhelp_policy import setup_70b

from fluidpd.core.metrics import Slo
from fluidpd.core.polynomial import Polynomial
from fluidpd.core.request import Request
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.chunked import Chunked, ChunkedLateLast
from fluidpd.policy.costs import CostModel
from fluidpd.policy.registry import POLICIES, make_policy
from fluidpd.policy.view import Role
from fluidpd.sim.run import simulate
from fluidpd.workload.trace import Trace
from fluidpd.world.worker import WorkerState

COSTS = CostModel(Slo(ttft_s=2.0, tbt_s=0.04), Polynomial((1e-5, 1e-3)), Polynomial((1e-5, 1e-3)))


def test_late_last_is_registered_and_takes_its_ttft_slo_from_the_costs():
    cfg = PolicyConfig(chunk_budget=256)
    p = make_policy("chunked-late-last", cfg, costs=COSTS)
    assert isinstance(p, ChunkedLateLast) and POLICIES.get("chunked-late-last").needs_costs
    assert p.slo_ttft_s == 2.0 and p.prefill_batching(Role.COLOCATED) == (256, True)
    assert p.prefill_batching(Role.COLOCATED) == make_policy("chunked", cfg).prefill_batching(Role.COLOCATED)
    with pytest.raises(ValueError, match="CostModel"):
        make_policy("chunked-late-last", cfg)
    with pytest.raises(ValueError, match="SLO_TTFT"):
        ChunkedLateLast(cfg, 0.0)


def test_a_step_serves_the_requests_still_on_time_before_the_late_ones():
    w = WorkerState(0, Role.COLOCATED, 0, 1000, 16)
    for r in (Request(0, 0.0, 300, 10), Request(1, 4.0, 300, 10), Request(2, 5.0, 300, 10)):
        w.enqueue(r)
    cfg = PolicyConfig(chunk_budget=400)
    view = SimpleNamespace(now=5.5)  # request 0 arrived 5.5 s ago: past the 2 s SLO
    fcfs = Chunked(cfg).plan_step(w, view)
    late_last = ChunkedLateLast(cfg, 2.0).plan_step(w, view)
    assert [(r.id, c) for r, c in fcfs.chunks] == [(0, 300), (1, 100)]
    assert [(r.id, c) for r, c in late_last.chunks] == [(1, 300), (2, 100)]


def test_in_simulation_late_requests_wait_behind_later_ones_that_can_still_make_it():
    """One worker: a burst of ten 3k-token prompts holds it for seconds, so its tail has missed
    SLO_TTFT while the small requests arriving every 0.5 s have not. FCFS serves first tokens in
    arrival order; late-last serves later arrivals before the burst's tail, and completes every request."""
    arrivals = [0.01 * i for i in range(10)] + list(np.arange(0.5, 10.0, 0.5))
    prompts = [3000] * 10 + [500] * (len(arrivals) - 10)
    trace = Trace("late", arrivals, prompts, [8] * len(arrivals))
    s = setup_70b(workers=1)
    order = {}
    for policy in ("chunked", "chunked-late-last"):
        res = simulate(trace, policy, s, keep_requests=True)
        assert res.summary["completed"] == len(trace)
        order[policy] = [r.id for r in sorted(res.cluster.metrics.finished, key=lambda r: r.first_token_s)]
    assert order["chunked"] == list(range(len(trace)))
    late_last = order["chunked-late-last"]
    assert late_last.index(9) > late_last.index(10)  # the burst's last prompt behind a later arrival
    assert sorted(late_last) == list(range(len(trace)))
