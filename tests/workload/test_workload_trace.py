import numpy as np
import pytest

from fluidpd.workload import Trace, compose


def make(n=10, step=1.0, name="t", **kw):
    return Trace(name, np.arange(n) * step, np.arange(1, n + 1), np.full(n, 7), **kw)


def test_fields_are_coerced_and_measured():
    t = Trace("t", [0, 1, 2, 4], [1, 2, 3, 4], np.array([5.0, 6.0, 7.0, 8.0]))
    assert t.arrival_s.dtype == np.float64 and t.prompt_len.dtype == np.int64 and t.output_len.dtype == np.int64
    assert len(t) == 4 and t.duration_s == 4.0 and t.mean_rate == 1.0


def test_empty_trace_has_zero_duration_and_rate():
    t = Trace("e", [], np.array([], np.int64), np.array([], np.int64))
    assert len(t) == 0 and t.duration_s == 0.0 and t.mean_rate == 0.0


@pytest.mark.parametrize(
    "arrival,prompt,output,match",
    [
        ([0, 1], [1], [1, 1], "equal length"),
        ([1, 0], [1, 1], [1, 1], "sorted"),
        ([-1, 0], [1, 1], [1, 1], ">= 0"),
        ([0, np.nan], [1, 1], [1, 1], "finite"),
        ([0, 1], [0, 1], [1, 1], ">= 1"),
        ([0, 1], [1, 1], [1, 0], ">= 1"),
        ([0, 1], [1.5, 1], [1, 1], "whole"),
    ],
)
def test_invalid_traces_are_rejected(arrival, prompt, output, match):
    with pytest.raises(ValueError, match=match):
        Trace("bad", arrival, prompt, output)


def test_hash_ids_and_span_are_checked():
    with pytest.raises(ValueError, match="hash_ids"):
        Trace("h", [0, 1], [1, 1], [1, 1], hash_ids=[[1]])
    with pytest.raises(ValueError, match="span_s"):
        Trace("s", [0, 5], [1, 1], [1, 1], span_s=4.0)


def test_scale_rate_compresses_time():
    t = make(101)
    fast = t.scale_rate(2.0)
    assert fast.duration_s == pytest.approx(t.duration_s / 2)
    assert fast.mean_rate == pytest.approx(2 * t.mean_rate)
    np.testing.assert_array_equal(fast.prompt_len, t.prompt_len)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="rate scale"):
            t.scale_rate(bad)


def test_window_keeps_half_open_interval_and_rebases():
    t = make(100, hash_ids=[[i] for i in range(100)], hash_block_size=512)
    w = t.window(10.0, 5.0)
    np.testing.assert_array_equal(w.arrival_s, [0, 1, 2, 3, 4])  # 10..14, not 15
    np.testing.assert_array_equal(w.prompt_len, [11, 12, 13, 14, 15])
    assert w.hash_ids == [[10], [11], [12], [13], [14]] and w.hash_block_size == 512
    assert w.duration_s == 5.0 and w.mean_rate == 1.0
    assert len(t.window(1000.0, 5.0)) == 0
    with pytest.raises(ValueError, match="duration"):
        t.window(0.0, 0.0)


def test_head_and_shift():
    t = make(10)
    assert len(t.head(3)) == 3 and t.head(3).arrival_s[-1] == 2.0
    assert len(t.head(50)) == 10
    with pytest.raises(ValueError):
        t.head(-1)
    s = t.shift(100.0)
    assert s.arrival_s[0] == 100.0 and s.duration_s == 109.0
    assert t.window(0, 20).shift(5).duration_s == 25.0
    with pytest.raises(ValueError, match=">= 0"):
        t.shift(-1.0)


def test_compose_places_phases_after_each_other():
    a = make(5, name="a").window(0, 10)  # arrivals 0..4, span 10
    b = make(3, step=0.5, name="b")  # arrivals 0, .5, 1
    c = compose([a, b, a], gap_s=2.0)
    np.testing.assert_array_equal(c.arrival_s, [0, 1, 2, 3, 4, 12, 12.5, 13, 15, 16, 17, 18, 19])
    assert (np.diff(c.arrival_s) >= 0).all()
    assert c.duration_s == 25.0 and c.name == "a+b+a"
    np.testing.assert_array_equal(c.prompt_len, np.r_[a.prompt_len, b.prompt_len, a.prompt_len])
    assert c.hash_ids is None


def test_compose_keeps_hashes_only_when_all_phases_have_them():
    a = make(2, hash_ids=[[1], [2]], hash_block_size=64)
    assert compose([a, a]).hash_ids == [[1], [2], [1], [2]]
    assert compose([a, make(2)]).hash_ids is None


def test_compose_rejects_bad_arguments():
    with pytest.raises(ValueError):
        compose([])
    with pytest.raises(ValueError):
        compose([make(2)], gap_s=-1)
