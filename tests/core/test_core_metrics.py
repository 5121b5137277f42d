import pytest

from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.core.request import Request


def finished(rid, arrival, ttft, tpot, n_out, gaps_over=0):
    r = Request(rid, arrival, 100, n_out)
    r.emit(arrival + ttft)
    r.generated = n_out
    r.last_token_s = arrival + ttft + tpot * (n_out - 1)
    r.finish_s = r.last_token_s
    r.add_gaps(n_out - 1, gaps_over)
    return r


def test_joint_attainment_is_distserve_definition_and_strict_uses_own_p99_gap():
    m = MetricsCollector(Slo(ttft_s=1.0, tbt_s=0.05))
    m.on_finish(finished(0, 0.0, 0.5, 0.04, 101))  # meets both
    m.on_finish(finished(1, 0.0, 1.5, 0.04, 101))  # TTFT miss
    m.on_finish(finished(2, 0.0, 0.5, 0.06, 101, gaps_over=100))  # TPOT miss: every gap slow
    m.on_finish(finished(3, 0.0, 0.5, 0.04, 101, gaps_over=2))  # mean ok, own P99 gap too slow
    m.on_finish(finished(4, 0.0, 0.5, 0.04, 101, gaps_over=1))  # 1 of 100 gaps over: P99 still ok
    s = m.summary(requests=6)  # one request never finished
    assert s["completed"] == 5
    assert s["attainment"] == pytest.approx(3 / 6)
    assert s["strict_attainment"] == pytest.approx(2 / 6)
    assert s["ttft_p99_s"] == pytest.approx(1.5, rel=0.05)


def test_tpot_of_single_token_output_is_zero_and_request_validates():
    r = Request(0, 0.0, 10, 1)
    r.emit(0.2)
    assert r.tpot_s == 0.0 and r.ttft_s == pytest.approx(0.2) and r.finished
    with pytest.raises(ValueError):
        Request(1, 0.0, 0, 5)
    with pytest.raises(ValueError):
        Slo(0.0, 0.1)


def test_p99_gap_nearest_rank():
    r = Request(0, 0.0, 10, 300)
    r.add_gaps(299, 2)
    assert r.p99_gap_within()  # 299 - ceil(296.01) = 2 gaps may exceed
    r.add_gaps(0, 1)
    assert not r.p99_gap_within()
