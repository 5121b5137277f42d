"""`fluidpd-pools`: sub-views, two-level routing, hand-offs inside a pool, FluidRole across pools."""

from dataclasses import replace

import numpy as np
import pytest
from simhelp_policy import setup_70b

from fluidpd.core.metrics import Slo
from fluidpd.core.request import Request
from fluidpd.policy.actions import Borrow, BorrowSplit, Migrate
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.pool_router import PrefixIndex
from fluidpd.policy.pool_view import PoolView
from fluidpd.policy.pools import FluidPDPools, pool_sizes
from fluidpd.policy.registry import POLICIES
from fluidpd.policy.view import Role
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload import load_trace
from fluidpd.workload.sessions import chat_sessions
from fluidpd.workload.synth import synthetic
from fluidpd.workload.trace import compose


def setup_8b(workers: int, pool_size: int = 64, prefill: int = 0, **fluid) -> Setup:
    return Setup(
        get_model("llama-3.1-8b", "bf16"),
        get_hardware("h100"),
        Slo(2.0, 0.04),
        SimConfig(n_workers=workers, gpus_per_node=8),
        PolicyConfig(prefill_workers=prefill),
        fluid=FluidConfig(pool_size=pool_size, **fluid),
    )


def test_pools_partition_the_workers_and_split_each_like_fluidpd():
    assert pool_sizes(1024, 64) == [64] * 16
    assert pool_sizes(100, 64) == [50, 50]
    assert pool_sizes(10, 4) == [4, 3, 3]
    assert pool_sizes(8, 64) == [8]
    s = setup_8b(16)
    costs = s.costs(s.roofline())
    one = FluidPDPools(PolicyConfig(), FluidConfig(), costs)
    assert one.roles(16) == FluidPD(PolicyConfig(), FluidConfig(), costs).roles(16)
    four = FluidPDPools(PolicyConfig(prefill_workers=6), FluidConfig(pool_size=4), costs)
    roles = four.roles(16)
    assert [p.ids for p in four.pools] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert sum(r is Role.PREFILL for r in roles) == 6
    for p in four.pools:  # each pool prefills and decodes
        assert {roles[i] for i in p.ids} == {Role.PREFILL, Role.DECODE}
    assert POLICIES.get("fluidpd-pools") is FluidPDPools
    with pytest.raises(ValueError):
        FluidConfig(pool_size=2)
    with pytest.raises(ValueError, match="fluidpd-pools needs a CostModel"):
        FluidPDPools(PolicyConfig(), FluidConfig(), None)
    assert one.follows_kv and one.routed_to_decode == 0  # (no pool has routed yet)
    other = FluidPDPools(PolicyConfig(router="shortest-queue"), FluidConfig(), costs)
    assert not other.follows_kv and other.routed_to_decode == 0
    assert POLICIES.get("static-pd")().routed_to_decode == 0  # (the Policy default)


def test_a_sub_view_iterates_its_pool_and_indexes_by_worker_id():
    class W:
        def __init__(self, i):
            self.id = i

    class V:
        now = 3.5
        workers = [W(i) for i in range(10)]

    ids = [2, 5, 7]
    sub = PoolView(V(), ids)
    assert [w.id for w in sub.workers] == [2, 5, 7] and len(sub.workers) == 3 and sub.now == 3.5
    assert sub.workers[7].id == 7  # by id, not position
    assert V.workers[5] in sub.workers and V.workers[4] not in sub.workers
    ids.append(9)  # membership changes show at once
    assert [w.id for w in sub.workers] == [2, 5, 7, 9]


def test_the_prefix_index_finds_a_session_and_a_shared_prefix():
    idx = PrefixIndex(entries=64)
    a = Request(0, 0.0, 160, 10, block_hashes=list(range(100, 110)), session=3)
    idx.add(a, 2, 16)
    b = Request(1, 1.0, 320, 10, block_hashes=list(range(100, 110)) + list(range(500, 510)), session=3)
    assert idx.hits(b, 16) == {2: 170}  # the session's whole context; the prefix index alone: 8 blocks
    c = Request(2, 1.0, 320, 10, block_hashes=list(range(100, 104)) + list(range(600, 616)))
    assert idx.hits(c, 16) == {2: 64}
    idx.add(c, 5, 16)
    assert idx.hits(c, 16) == {5: 320, 2: 64}
    for k in range(200):  # LRU-bounded
        idx.add(Request(10 + k, 2.0, 16, 1, block_hashes=[10_000 + k]), 1, 16)
    assert len(idx.pools) <= 64 and idx.hits(c, 16) == {}


def comparable(result) -> tuple:
    """Per-request outcomes and the summary without the wall time."""
    reqs = sorted(result.cluster.metrics.finished, key=lambda r: r.id)
    per = [(r.id, r.first_token_s, r.finish_s, r.worker, r.borrowed, r.migrations, r.gaps_over) for r in reqs]
    return per, {k: v for k, v in result.summary.items() if k != "sim_wall_s"}


def test_one_pool_holding_every_worker_decides_as_fluidpd():
    heavy_p = synthetic(60, 20.0, prompt_len=4000, output_len=4, seed=1)
    heavy_d = synthetic(60, 20.0, prompt_len=100, output_len=600, seed=2)
    trace = compose([heavy_p.window(0, 1.5), heavy_d.window(0, 1.5)] * 10)  # FluidToken borrows, FluidRole switches
    s = setup_70b()
    plain = simulate(trace, "fluidpd", s, keep_requests=True)
    pooled = simulate(trace, "fluidpd-pools", s, keep_requests=True)
    assert plain.summary["completed"] == len(trace)
    assert plain.cluster.metrics.finished and any(r.borrowed for r in plain.cluster.metrics.finished)
    assert comparable(pooled) == comparable(plain)
    switches = [
        [(t.worker, t.dst_role, t.began_s, t.ended) for t in x.cluster.policy.transitions] for x in (plain, pooled)
    ]
    assert switches[0] and switches[0] == switches[1]


class Checked(FluidPDPools):
    """Records every decision's pools: a hand-off's source and destination, a borrow's or a
    migration's, and the pool each session's requests were routed to."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.crossed: list = []
        self.session_pools: dict[int, set[int]] = {}
        self.handoffs = 0

    def route(self, req, view):
        wid = super().route(req, view)
        if req.session >= 0:
            self.session_pools.setdefault(req.session, set()).add(self.pool_of[wid])
        return wid

    def handoff(self, req, worker, view):
        dst = super().handoff(req, worker, view)
        if dst is not None:
            self.handoffs += 1
            if self.pool_of[dst] != self.pool_of[worker.id]:
                self.crossed.append(("handoff", req.id, worker.id, dst))
        return dst

    def tick(self, view):
        actions = super().tick(view)
        for a in actions:
            if isinstance(a, (Borrow, Migrate)) and self.pool_of[a.src] != self.pool_of[a.dst]:
                self.crossed.append((type(a).__name__, a.src, a.dst))
            if isinstance(a, BorrowSplit) and len({self.pool_of[w] for w in (a.src, *a.dsts)}) > 1:
                self.crossed.append(("split", a.src, a.dsts))
        return actions


def test_several_pools_complete_every_request_and_keep_kv_inside_a_pool():
    trace = load_trace("azure_code").scale_rate(40).window(0.0, 20.0)
    s = setup_8b(16, pool_size=4)
    r = simulate(trace, "fluidpd-pools", s, keep_requests=True, policy_cls=Checked)
    pol = r.cluster.policy
    assert [len(p.ids) for p in pol.pools] == [4, 4, 4, 4]
    assert r.summary["completed"] == len(trace) and r.summary["rejected"] == 0
    assert pol.handoffs > 100 and pol.crossed == []
    assert all(w.kv_blocks_used == 0 and not w.held for w in r.cluster.workers)
    plain = simulate(trace, "fluidpd", s)
    assert r.summary["attainment"] >= plain.summary["attainment"] - 0.02


def test_a_sessions_turns_land_in_one_pool():
    trace = chat_sessions(64, 4, system_tokens=1500, new_tokens=300, output_tokens=100, groups=4, start_spread_s=5)
    s = setup_8b(16, pool_size=4)
    r = simulate(trace, "fluidpd-pools", s, keep_requests=True, policy_cls=Checked)
    pol = r.cluster.policy
    assert r.summary["completed"] == len(trace)
    assert pol.crossed == [] and pol.handoffs > 0  # (later turns mostly prefill on their decode worker)
    assert len(pol.session_pools) == 64 and all(len(p) == 1 for p in pol.session_pools.values())
    assert len({i for p in pol.session_pools.values() for i in p}) > 1  # spread over the pools, each in its own
    on_decode = sum(p.policy.affinity.on_decode for p in pol.pools)  # the pools' routers' counts, summed
    assert r.summary["routed_to_decode"] == pol.routed_to_decode == on_decode > 0


class ToPoolZero(Checked):
    """A hot tenant: the router tier sends every request to pool 0."""

    def choose_pool(self, req, view):
        super().choose_pool(req, view)
        return 0


@pytest.mark.parametrize("prefill, moved_by", [(0, "transition"), (4, "direct")])
def test_a_sustained_prefill_surge_in_one_pool_moves_a_worker_into_it(prefill, moved_by):
    calm = synthetic(60, 4.0, prompt_len=("uniform", 200, 400), output_len=("uniform", 50, 150), seed=1)
    surge = synthetic(400, 40.0, prompt_len=("uniform", 3000, 6000), output_len=("uniform", 50, 200), seed=2)
    trace = compose([calm, surge, calm])
    s = setup_8b(12, pool_size=6, prefill=prefill, tau_residence_s=1.0)
    r = simulate(trace, "fluidpd-pools", s, keep_requests=True, policy_cls=ToPoolZero)
    pol = r.cluster.policy
    assert r.summary["completed"] == len(trace)
    assert pol.crossed == []
    moved = [m for m in pol.balance.moves if m.outcome == "moved"]
    assert moved and all(m.src == 1 and m.dst == 0 for m in moved)
    assert (moved[0].transition is not None) == (moved_by == "transition")
    assert len(pol.pools[0].ids) == 6 + len(moved) and len(pol.pools[1].ids) == 6 - len(moved)
    w = r.cluster.workers[moved[0].worker]
    assert w.role is Role.PREFILL and pol.pool_of[w.id] == 0
    if moved_by == "transition":
        t = moved[0].transition
        assert t.done and t.reason == "pool 1 -> 0"
    got = np.array([r.first_token_s for r in r.cluster.metrics.finished])
    assert np.isfinite(got).all()


def test_force_role_keeps_one_worker_of_each_role_in_a_pool():
    s = setup_8b(8, pool_size=4)
    r = simulate(synthetic(10, 5.0, seed=0), "fluidpd-pools", s)
    pol, cl = r.cluster.policy, r.cluster
    assert [p.ids for p in pol.pools] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="last serving prefill worker of pool 1"):
        pol.force_role(4, Role.DECODE, cl)
    pol.force_role(5, Role.PREFILL, cl)
    assert pol.switching() == [(5, Role.PREFILL)] and pol.pools[1].policy.forced == [(5, Role.PREFILL)]
    assert replace(FluidConfig(), pool_size=8).pool_size == 8
