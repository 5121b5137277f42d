"""FluidToken on a host whose workers share its cores: no borrowing while prefill fills every core."""

from __future__ import annotations

from dataclasses import replace

from fluidpd.bench.capacity import Window, host_setup
from fluidpd.core.metrics import Slo
from fluidpd.policy.actions import Borrow, BorrowSplit
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.view import Role
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import simulate

SLO = Slo(5.0, 0.5)
SCALES = {"decode": 1.2, "prefill": 4.0}  # this 2-core host's steps against the cpu-host profile


def window_trace():
    """runtime_table1's window at the rate it replayed on a 2-core host (2026-12-06): bursts of
    500-token prompts that keep three prefill workers busy at once."""
    window, _ = Window.parse("azure_code:0.1@9100", 150.0)
    return window.at(0.0177, 300, 512)


def run(prefill_workers: int, slots: int | None = None):
    """The window through fluidpd on four cpu-host workers; each Borrow with how many prefill
    workers had work then. `slots` overrides what the policy is told of the host's cores."""
    borrows: list[int] = []

    class Watched(FluidPD):
        @classmethod
        def build(cls, config=None, fluid=None, costs=None):
            return cls(config, fluid, costs if slots is None else replace(costs, compute_slots=slots))

        def tick(self, view):
            actions = super().tick(view)
            busy = sum(1 for w in view.workers if w.role is Role.PREFILL and w.queue)
            borrows.extend(busy for a in actions if isinstance(a, (Borrow, BorrowSplit)))
            return actions

    result = simulate(window_trace(), "fluidpd", host_setup(4, SLO, SCALES, prefill_workers), policy_cls=Watched)
    return result.summary, borrows


def test_the_cpu_host_profile_runs_two_prefill_steps_at_full_speed():
    setup = host_setup(4, SLO, SCALES, 3)
    assert setup.roofline().sim_config(setup.sim).compute_slots() == 2  # 1.0, 1.03, then 1.67 and 2.12
    assert SimConfig().compute_slots() == 0  # GPUs: a device each
    assert SimConfig(contention_prefill=(1.0, 1.05, 1.08, 1.5)).compute_slots() == 3


def test_no_chunk_is_borrowed_while_prefill_workers_fill_the_cores():
    summary, borrows = run(3)
    assert borrows == []  # three prefill workers on two cores: every burst keeps two or more busy
    told_nothing, unchecked = run(3, slots=0)
    assert unchecked and max(unchecked) >= 2  # without the check it borrows into busy cores ...
    assert summary["attainment"] > told_nothing["attainment"]  # ... and loses requests by it


def test_a_lone_prefill_worker_still_lends_to_the_idle_cores():
    _, borrows = run(1)
    assert borrows and max(borrows) == 1
