"""Role switches that cannot wedge the cluster: a drain over its timeout rolls back, a worker lost
mid-switch abandons it, and a lost worker's late phase report is fenced off by the epoch."""

from __future__ import annotations

import pytest
from test_world_lifecycle import assert_clean
from tinyworld import TinyWorld, requests

from fluidpd.policy.fluidrole import ROLLED_BACK, SwitchConflict
from fluidpd.policy.view import Role


def switching_world(kv_blocks: int = 512, timeout_s: float = 30.0):
    reqs = requests(30, prompt=40, output=600, gap_s=0.001)  # ~0.7 s of decode: longer than a drain waits
    world = TinyWorld("fluidpd", 4, kv_blocks=kv_blocks)
    world.policy.fluid.drain_timeout_s = timeout_s
    world.arrive(reqs)
    world.run(until=0.02)
    world.policy.force_role(1, Role.PREFILL, world)
    return world, reqs


def run_until(world: TinyWorld, cond, step_s: float = 1e-3, limit_s: float = 5.0) -> None:
    while not cond():
        assert world.loop.now < limit_s, "the condition never held"
        world.run(until=world.loop.now + step_s)


def tokens_exact(reqs) -> bool:
    return all(r.generated == r.output_len and r.gaps == r.output_len - 1 for r in reqs)


def test_a_drain_over_its_timeout_rolls_back_and_the_worker_serves_in_its_old_role():
    # decode workers this full cannot take worker 1's requests: its drain would wait ~0.6 s
    world, reqs = switching_world(kv_blocks=72, timeout_s=0.1)
    run_until(world, lambda: world.policy.transitions and world.policy.transitions[0].phase != "drain")
    (t,) = world.policy.transitions
    assert t.phase == ROLLED_BACK and t.rolled_back and not t.done and "rolled back" in t.reason
    assert 0.1 <= t.ended["drain"] - t.began_s < 0.12
    w = world.workers[1]
    assert w.role is Role.DECODE and w.routable and w.role_since == pytest.approx(t.ended["drain"])
    assert world.policy.transition is None
    world.run()
    assert_clean(world, reqs)
    assert tokens_exact(reqs) and not world.failures
    assert world.workers[1].role is Role.DECODE


def test_a_worker_lost_mid_drain_abandons_its_switch_and_nothing_is_lost():
    world, reqs = switching_world()
    run_until(world, lambda: world.workers[1].transfers_out > 0)  # migrations in flight
    in_flight = world.workers[1].transfers_out
    restarted = world.lose_worker(1)  # those in flight are left to their transfer; the rest start over
    assert len(restarted) + in_flight >= 1 and world.policy.transition is None
    assert "abandoned" in world.policy.transitions[0].reason
    with pytest.raises(SwitchConflict, match="not serving"):
        world.policy.force_role(1, Role.PREFILL, world)
    world.run(until=world.loop.now + 0.05)
    world.rejoin_worker(1, Role.DECODE)
    world.policy.force_role(1, Role.PREFILL, world)  # the replacement can switch like any worker
    world.run()
    assert_clean(world, reqs)
    assert tokens_exact(reqs) and not world.failures
    assert world.workers[1].role is Role.PREFILL and world.policy.transitions[-1].done


def test_a_lost_workers_late_phase_report_is_stale_and_ignored():
    world, reqs = switching_world()
    run_until(world, lambda: world.policy.transition is not None and world.policy.transition.phase == "remap")
    old = world.policy.transition
    world.lose_worker(1)  # its remap is still in flight: its report comes 1 ms later
    world.rejoin_worker(1, Role.DECODE)
    world.policy.force_role(1, Role.PREFILL, world)
    world.run(until=world.loop.now + 0.011)  # the next cycle starts the new switch
    new = world.policy.transition
    assert new is not None and new.epoch != old.epoch and new.phase == "drain"
    world.run()
    assert "remap" not in old.ended and new.done  # the old remap changed nothing
    assert_clean(world, reqs)
    assert tokens_exact(reqs) and world.workers[1].role is Role.PREFILL


def test_switches_the_cluster_state_forbids_are_conflicts():
    world, _ = switching_world()
    with pytest.raises(SwitchConflict, match="already switching"):
        world.policy.force_role(1, Role.PREFILL, world)
    world.run()
    # workers: 0 and 1 prefill, 2 and 3 decode
    world.policy.force_role(2, Role.PREFILL, world)
    with pytest.raises(SwitchConflict, match="last serving decode"):
        world.policy.force_role(3, Role.PREFILL, world)
    with pytest.raises(ValueError, match="cannot switch"):
        world.policy.force_role(0, Role.PREFILL, world)
