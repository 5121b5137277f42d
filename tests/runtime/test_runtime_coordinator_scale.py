"""The runtime's coordinator over 256 fake workers (no engines, no processes) runs its control cycle
and decides (issue 54, ask 5). What it decides is checked, never how fast: timings are
benchmarks/runtime/coordinator_scale.py's."""

from __future__ import annotations

import asyncio

from fluidpd.bench.fake_coordinator import drive
from fluidpd.policy.fluidpd import BALANCED, OVERLOADED, PREFILL_DEFICIT, PREFILL_SPIKE
from fluidpd.policy.view import Role


def test_a_coordinator_over_256_fake_workers_runs_its_cycle_and_borrows_in_a_burst():
    coord, stats = asyncio.run(drive(256, 1.5, per_worker=10, scenario="burst", sample=2))
    cl = coord.cluster
    policy = cl.policy
    assert len(stats.timings.tick) >= 2 and len(cl.workers) == 256  # the 10 ms loop ran, over every worker
    assert stats.submitted > 0 and stats.refused == 0  # requests went through admission and routing
    _, ppi, _, state = policy.history[0]  # the first cycle: 30% of 2,560 requests queued, the oldest late
    assert ppi > 1.0 and state in (PREFILL_SPIKE, PREFILL_DEFICIT, OVERLOADED)
    assert policy.token.borrowed > 0  # FluidToken moved prompts onto decode workers with slack...
    moved = [r for w in cl.workers if w.role is Role.DECODE for r in w.queue if r.borrowed]
    assert moved or any(r.borrowed for w in cl.workers for r in w.decoding.values())  # ...and the world moved them


def test_a_steady_coordinator_over_256_fake_workers_stays_balanced():
    coord, stats = asyncio.run(drive(256, 1.0, per_worker=10, scenario="steady", sample=2))
    policy = coord.cluster.policy
    assert len(stats.timings.tick) >= 2 and stats.submitted > 0
    assert policy.state == BALANCED and policy.pressure.ppi < 1.0 and not policy.transitions
    assert policy.token.borrowed == 0


def test_the_runtime_coordinator_runs_fluidpd_pools_and_each_pool_decides_over_its_own_workers():
    coord, stats = asyncio.run(drive(256, 1.5, per_worker=10, scenario="burst", sample=2, policy="fluidpd-pools"))
    cl = coord.cluster
    policy = cl.policy
    assert [len(p.ids) for p in policy.pools] == [64] * 4
    assert len(stats.timings.tick) >= 2 and stats.submitted > 0 and stats.refused == 0
    for pool in policy.pools:  # every pool's own FluidPD ticked over its sub-view and saw the burst
        assert pool.policy.history and max(ppi for _, ppi, _, _ in pool.policy.history) > 1.0
    assert sum(p.policy.token.borrowed for p in policy.pools) > 0  # FluidToken borrowed within pools
