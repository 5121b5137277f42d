"""PPI and DPI exactly as the seed writes them, on real simulator workers."""

import pytest

from fluidpd.core.polynomial import Polynomial
from fluidpd.core.request import Request
from fluidpd.policy.jitter import JitterTracker, OverrunTracker
from fluidpd.policy.telemetry import decode_pressure_index, prefill_pressure_index
from fluidpd.policy.view import Role
from fluidpd.world.worker import WorkerState


class View:
    def __init__(self, now, workers):
        self.now, self.workers = now, workers


F_P = Polynomial((0.001, 0.01))  # f_P(s) = 0.001 s + 0.01 (seconds)


def test_ppi_hand_computation():
    p0, p1 = WorkerState(0, Role.PREFILL, 0, 100), WorkerState(1, Role.PREFILL, 0, 100)
    d = WorkerState(2, Role.DECODE, 0, 100)
    p0.enqueue(Request(0, 0.0, 1000, 5))  # f=1.01 s, waited 2 s: late by 2 + 1.01 - 1.5 = 1.51
    p0.enqueue(Request(1, 1.9, 200, 5))  # f=0.21, late by 0.1 + 0.21 - 1.5 < 0
    r = Request(2, 1.0, 500, 5)
    r.prefilled = 300  # remaining 200: f=0.21, late by 1 + 0.21 - 1.5 < 0
    p1.enqueue(r)
    ppi = prefill_pressure_index(View(2.0, [p0, p1, d]), F_P, slo_ttft_s=1.5)
    work = 1.01 + 0.21 + 0.21
    assert ppi == pytest.approx((work + 1.51) / (2 * 1.5))
    p1.routable = False  # a draining worker gives no capacity
    assert prefill_pressure_index(View(2.0, [p0, p1, d]), F_P, 1.5) == pytest.approx((work + 1.51) / 1.5)


def test_ppi_is_capped_and_zero_when_idle():
    p = WorkerState(0, Role.PREFILL, 0, 100)
    assert prefill_pressure_index(View(0.0, [p]), F_P, 1.0) == 0.0
    for i in range(1000):
        p.enqueue(Request(i, 0.0, 4000, 5))
    assert prefill_pressure_index(View(100.0, [p]), F_P, 1.0, ppi_cap=7.0) == 7.0


def test_dpi_hand_computation():
    a, b = WorkerState(0, Role.DECODE, 0, 100), WorkerState(1, Role.DECODE, 0, 200)
    p = WorkerState(2, Role.PREFILL, 0, 100)
    a.step_time_ewma_s, a.kv_blocks_used = 0.030, 50
    b.step_time_ewma_s, b.kv_blocks_used = 0.010, 20
    p.step_time_ewma_s, p.kv_blocks_used = 1.0, 100  # prefill workers do not count
    dpi = decode_pressure_index(View(0.0, [a, b, p]), slo_tbt_s=0.04, alpha=0.25)
    b.pull_blocks_pending = 30
    assert decode_pressure_index(View(0.0, [a, b, p]), 0.04, 0.25) == pytest.approx(dpi + 0.75 * 0.15 / 2)
    expected = ((0.25 * 0.75 + 0.75 * 0.5) + (0.25 * 0.25 + 0.75 * 0.1)) / 2
    assert dpi == pytest.approx(expected)


def test_jitter_guard_is_learned_from_the_tail():
    t = JitterTracker(factor=1.5, quantile=0.999, default_s=0.003, min_samples=100)
    assert t.guard_s == 0.003
    for i in range(10_000):
        t.observe(0.004 if i % 1000 == 0 else 0.0005)  # 0.1% at 4 ms
    assert t.tail_s() == pytest.approx(0.0005, rel=0.07)
    for _ in range(100):
        t.observe(0.004)
    assert t.tail_s() == pytest.approx(0.004, rel=0.07)
    t.observe(0.0)
    assert 1.4 * 0.004 < t.guard_s < 1.6 * 0.004 * 1.07


def test_overrun_factor_is_the_recent_p99_of_measured_over_estimated():
    t = OverrunTracker(quantile=0.99, min_samples=8, window=200)
    assert not t.ready and t.factor == 1.0
    for i in range(7):
        t.observe(0.012 if i == 3 else 0.010, 0.010)
    assert not t.ready and t.factor == pytest.approx(1.2)  # a few steps: their largest
    t.observe(0.010, 0.010)
    assert t.ready
    for i in range(200):
        t.observe(0.013 if i % 100 == 0 else 0.009, 0.010)  # 1% at 1.3x: within the p99's tail
    assert t.factor == 1.0
    for i in range(200):
        t.observe(0.013 if i % 50 == 0 else 0.009, 0.010)  # 2% at 1.3x: past it
    assert t.factor == pytest.approx(1.3)
    for _ in range(200):
        t.observe(0.008, 0.010)  # the window forgets; the factor never prices a step below its estimate
    assert t.factor == 1.0
    t.observe(0.02, 0.0)  # nothing estimated: nothing learned
    assert t.factor == 1.0


def test_batched_prefill_time_prices_the_steps_the_batching_makes():
    from fluidpd.core.polynomial import Polynomial
    from fluidpd.policy.costs import batched_prefill_time

    f = Polynomial((0.001, 0.1))  # 100 ms a step plus 1 ms a token
    # L_m = 64, whole prompts: [40, 20] share a step, 96 runs alone, [30] is the last step
    assert batched_prefill_time([40, 20, 96, 30], f, 64) == pytest.approx(3 * 0.1 + 0.186)
    assert batched_prefill_time([96, 96, 96], f, 64) == pytest.approx(3 * f(96))  # each longer than L_m: alone
    # chunked: 200 tokens in 64-token chunks = 3 full steps and one of 8 tokens
    assert batched_prefill_time([100, 100], f, 64, split=True) == pytest.approx(3 * f(64) + f(8))
    assert batched_prefill_time([], f, 64) == 0.0
