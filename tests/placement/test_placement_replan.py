"""Replanning: the profiler, restarts under distserve, FluidRole under fluidpd."""

import dataclasses

import numpy as np
import pytest

from fluidpd.core.metrics import Slo
from fluidpd.placement.replan import ReplanConfig, Replanner
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.view import Role
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.profiler import ProfilerConfig, WorkloadProfiler, WorkloadStats
from fluidpd.workload.sampling import sample_requests
from fluidpd.workload.trace import compose


def test_profiler_flags_a_shift_only_once_it_persists():
    p = WorkloadProfiler(ProfilerConfig(window_s=100.0, threshold=0.3, persist_s=50.0))
    t = 0.0
    for i in range(2000):  # 10 req/s, 500-token prompts, then 2000-token prompts from t = 100
        t = i * 0.1
        p.observe_arrival(t, 500 if t < 100 else 2000)
        p.observe_finished(t, 100)
        if i % 100 == 0:
            flagged = p.shifted(t)
            if t <= 120:
                assert not flagged, t  # the reference window, then a shift not yet persisted
    assert p.shifted(t)
    ref = p.rebase(t)
    assert ref is not None and ref.prompt_mean == pytest.approx(2000, rel=0.01) and not p.shifted(t)
    h = p.history(t)
    assert abs(len(h) - 1000) <= 1 and set(h.output_len.tolist()) == {100}


def test_stats_change_is_the_largest_relative_one():
    a, b = WorkloadStats(10.0, 500.0, 100.0), WorkloadStats(12.0, 500.0, 50.0)
    assert b.change(a) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        ProfilerConfig(threshold=0.0)


def _setup(k: int = 1) -> Setup:
    return Setup(
        get_model("llama-3.1-8b", "bf16"),
        get_hardware("h100"),
        Slo(2.0, 0.05),
        SimConfig(n_workers=4),
        PolicyConfig(prefill_workers=k),
    )


def _shifting_workload():
    """Decode-heavy for 300 s, then prefill-heavy (long prompts, short outputs) for 600 s."""
    rng = np.random.default_rng(0)
    chat = sample_requests(rng.integers(100, 300, 1500), rng.integers(200, 400, 1500), 5.0, duration_s=300.0, seed=1)
    code = sample_requests(rng.integers(3000, 6000, 1500), rng.integers(5, 15, 1500), 8.0, duration_s=600.0, seed=2)
    return compose([chat, code])


@pytest.fixture(scope="module")
def runs():
    trace = _shifting_workload()
    config = ReplanConfig(check_s=20.0, profiler=ProfilerConfig(window_s=120.0, threshold=0.3, persist_s=40.0))
    out = {}
    for policy in ("distserve", "fluidpd"):
        r = Replanner(_setup(1), config, restart_s=30.0)
        res = simulate(trace, policy, _setup(1), keep_requests=True, before_run=r.attach)
        out[policy] = (r, res, trace)
    return out


@pytest.mark.slow
def test_a_persistent_shift_replans_toward_prefill(runs):
    for policy, (r, _, _) in runs.items():
        assert r.replans, policy
        first = r.replans[0]
        assert first.at_s > 300.0 + 40.0  # after the shift, once it persisted
        assert first.after > first.before, policy
        assert first.prompt_mean > 1000


@pytest.mark.slow
def test_distserve_restarts_and_nothing_is_lost(runs):
    _, res, trace = runs["distserve"]
    restarts = [t for t in res.cluster.policy.transitions if t.is_restart]
    assert restarts and all(t.dst_role is Role.PREFILL for t in restarts[:1])
    done = [t for t in restarts if t.done]
    assert done and all(t.durations()["restart"] == pytest.approx(30.0) for t in done)
    assert res.summary["completed"] == len(trace)
    assert all(w.kv_blocks_used == 0 for w in res.cluster.workers)


@pytest.mark.slow
def test_fluidpd_applies_plans_in_place(runs):
    _, res, trace = runs["fluidpd"]
    ts = res.cluster.policy.transitions
    assert ts and not any(t.is_restart for t in ts)
    assert any(t.reason == "admin" for t in ts)  # the replanner's switches
    assert all(t.total_s < 30.0 for t in ts if t.done)
    assert res.summary["completed"] == len(trace)


def test_only_policies_that_change_their_split_can_be_replanned():
    with pytest.raises(ValueError, match="cannot change its split"):
        simulate(
            _shifting_workload().head(50),
            "static-pd",
            _setup(),
            keep_requests=True,
            before_run=Replanner(_setup()).attach,
        )
    with pytest.raises(ValueError, match="keep_requests"):
        simulate(_shifting_workload().head(50), "distserve", _setup(), before_run=Replanner(_setup()).attach)


def test_distserve_refuses_to_restart_the_last_worker_of_a_role():
    from fluidpd.policy.distserve import DistServe

    pol = DistServe(dataclasses.replace(PolicyConfig(), prefill_workers=1))

    class View:
        now = 0.0
        workers = [
            type("W", (), {"id": i, "role": r, "routable": True})() for i, r in enumerate([Role.PREFILL, Role.DECODE])
        ]

    with pytest.raises(ValueError, match="last"):
        pol.force_role(0, Role.DECODE, View())


def test_the_sla_planner_sizes_the_split_from_the_last_interval():
    from fluidpd.placement.autoscaler import AutoscalerConfig, SlaPlanner

    trace = _shifting_workload()
    planner = SlaPlanner(_setup(2), AutoscalerConfig(interval_s=30.0), restart_s=10.0)
    res = simulate(trace, "distserve", _setup(2), keep_requests=True, before_run=planner.attach)
    assert planner.replans
    chat = [p for p in planner.replans if p.at_s <= 300.0]
    code = [p for p in planner.replans if p.at_s > 300.0]
    assert code and max(p.after for p in code) > min([p.after for p in chat] or [2])  # more prefill for code
    assert all(1 <= p.after <= 3 for p in planner.replans)
    assert all(t.is_restart and t.restart_s == 10.0 for t in res.cluster.policy.transitions)
    assert res.summary["completed"] == len(trace)
    assert planner.decode_tok_s(1000) > planner.decode_tok_s(100_000) > 0
    with pytest.raises(ValueError):
        AutoscalerConfig(interval_s=0.0)
