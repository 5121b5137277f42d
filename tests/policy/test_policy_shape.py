"""The shape predictor behind FluidRole's decode -> prefill switches."""

import dataclasses
import math

import pytest
from simhelp_policy import run_elastic, setup_70b

from fluidpd.core.metrics import Slo
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.shape import PrefillDemand, PrefillForecast, predicted_ppi
from fluidpd.policy.view import Role
from fluidpd.sim.run import switch_rate
from fluidpd.workload.synth import synthetic


def test_demand_is_the_work_of_the_last_horizon_over_its_full_length():
    d = PrefillDemand(10.0)
    d.add(0.0, 4.0)
    assert d.rate(1.0) == pytest.approx(0.4)  # a young run divides by the whole horizon
    d.add(5.0, 6.0)
    assert d.rate(9.0) == pytest.approx(1.0)
    assert d.rate(12.0) == pytest.approx(0.6)  # the first routing left the horizon
    assert d.rate(16.0) == 0.0


def test_predicted_ppi_reads_where_the_backlog_will_be_after_the_horizon():
    # 20 s of work, 2 s/s arriving, 3 prefill workers' worth: cleared within 30 s
    assert predicted_ppi(20.0, 2.0, 3.0, 2.0, 30.0) == 0.0
    # arrivals outrun the capacity: the backlog grows by 1 s a second
    assert predicted_ppi(20.0, 4.0, 3.0, 2.0, 30.0) == pytest.approx(50.0 / 6.0)
    assert math.isinf(predicted_ppi(1.0, 0.0, 0.0, 2.0, 30.0))
    assert predicted_ppi(0.0, 0.0, 0.0, 2.0, 30.0) == 0.0


def test_a_decode_worker_that_borrows_a_full_workers_worth_gains_nothing_by_switching():
    fc = PrefillForecast(50.0, 5.0, 2, {3: 1.0, 4: 0.25}, 2.0, 30.0)
    assert fc.capacity == pytest.approx(3.25)
    assert fc.gain_s(3) == 0.0
    assert fc.gain_s(4) == pytest.approx(22.5)
    assert fc.gain_s(9) == pytest.approx(30.0)  # not borrowing at all
    assert FluidConfig(horizon_s=10.0, switch_cost_s=0.0).horizon_s == 10.0
    with pytest.raises(ValueError):
        FluidConfig(horizon_s=0.0)
    with pytest.raises(ValueError):
        FluidConfig(switch_cost_s=-1.0)


def _decode_to_prefill(pol) -> int:
    return sum(1 for t in pol.transitions if t.dst_role is Role.PREFILL)


def test_a_burst_the_decode_workers_absorb_moves_no_worker_but_a_sustained_deficit_does():
    """Six seconds of long prompts into idle decode workers: PPI stays above theta_P_high for
    seconds, but FluidToken's borrowing clears the backlog within the horizon, so no decode worker
    leaves. Under a TBT SLO that leaves the decode workers no slack to borrow in, a minute of them
    outruns the shape: decode workers switch to prefill."""
    burst = synthetic(120, 20.0, prompt_len=6000, output_len=8, seed=3)
    c = run_elastic(burst, FluidPD, setup_70b())
    pol = c.policy
    assert max(p for _, p, _, _ in pol.history) > pol.fluid.theta_p_high
    assert _decode_to_prefill(pol) == 0
    assert c.metrics.summary(len(burst))["completed"] == len(burst)

    sustained = synthetic(600, 10.0, prompt_len=6000, output_len=8, seed=4)
    c = run_elastic(sustained, FluidPD, dataclasses.replace(setup_70b(), slo=Slo(2.0, 0.025)))
    assert _decode_to_prefill(c.policy) >= 1
    assert c.metrics.summary(len(sustained))["completed"] == len(sustained)
    rate = switch_rate(c)
    assert rate["role_switches"] == len(c.policy.transitions)
    assert rate["switches_per_hour"] == pytest.approx(len(c.policy.transitions) * 3600 / sustained.duration_s)


def test_a_decode_to_prefill_switch_waits_a_horizon_after_the_switch_it_would_undo():
    from fluidpd.policy.fluidrole import RoleTransition

    s = setup_70b()
    pol = FluidPD(s.policy, s.fluid, s.costs(s.roofline()))
    pol.transitions.append(RoleTransition(0, Role.PREFILL, Role.DECODE, 10.0))  # auto: prefill -> decode
    h = pol.fluid.horizon_s
    assert pol._reversal(10.0 + h - 0.1, Role.PREFILL)  # back to prefill: held for a horizon
    assert not pol._reversal(10.0 + h, Role.PREFILL)
    assert not pol._reversal(11.0, Role.DECODE)  # the same direction again is no reversal
    pol.transitions.append(RoleTransition(1, Role.DECODE, Role.PREFILL, 12.0, reason="admin"))
    assert pol._reversal(12.5, Role.PREFILL)  # an admin switch is not what the hold is about


def test_past_saturation_late_last_keeps_more_requests_within_the_slo_and_loses_none():
    """20 s of prompts beyond the cluster's prefill capacity, then a lull: FCFS serves the requests
    that have missed already and makes the next ones miss too; late-last serves the ones that can
    still make it first (58.5% -> 68.2% joint when written), and every request still completes."""
    lengths = {"prompt_len": ("lognormal", 2000, 0.8), "output_len": ("lognormal", 100, 0.8)}
    trace = synthetic(400, 20.0, **lengths, seed=5)
    got = {}
    for order in ("fcfs", "late-last"):
        s = setup_70b()
        s = dataclasses.replace(s, fluid=dataclasses.replace(s.fluid, queue_order=order))
        c = run_elastic(trace, FluidPD, s)
        summary = c.metrics.summary(len(trace))
        assert summary["completed"] == len(trace)
        assert all(w.kv_blocks_used == 0 and not w.queue for w in c.workers)
        got[order] = summary["attainment"]
    assert got["late-last"] > got["fcfs"] + 0.05, got
    with pytest.raises(ValueError):
        FluidConfig(queue_order="lifo")
