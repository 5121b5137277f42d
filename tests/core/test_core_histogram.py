import math

import numpy as np
import pytest

from fluidpd.core.histogram import StreamingHistogram


def test_quantiles_match_numpy_within_relative_error():
    rng = np.random.default_rng(0)
    xs = rng.lognormal(-3.5, 0.7, size=50_000)
    h = StreamingHistogram()
    h.add_many(xs[:25_000])
    for x in xs[25_000:]:
        h.add(float(x))
    for q in (0.5, 0.9, 0.99, 0.999):
        assert h.quantile(q) == pytest.approx(np.quantile(xs, q), rel=0.012)
    assert h.total == 50_000 and h.mean == pytest.approx(xs.mean())
    assert h.max == pytest.approx(xs.max())


def test_weights_count_as_repeated_samples_and_merge_adds():
    a, b = StreamingHistogram(), StreamingHistogram()
    a.add(0.010, weight=99)
    a.add(0.500)
    b.add(0.010)
    b.add(0.500, weight=99)
    assert a.quantile(0.5) == pytest.approx(0.010, rel=0.01)
    assert a.quantile(1.0) == pytest.approx(0.500, rel=0.01)
    a.merge(b)
    assert a.total == 200 and a.quantile(0.25) == pytest.approx(0.010, rel=0.01)
    assert a.quantile(0.75) == pytest.approx(0.500, rel=0.01)


def test_empty_and_bad_arguments():
    h = StreamingHistogram()
    assert math.isnan(h.quantile(0.5))
    with pytest.raises(ValueError):
        h.quantile(1.5)
    with pytest.raises(ValueError):
        StreamingHistogram(lo=1.0, hi=0.1)
    with pytest.raises(ValueError):
        h.merge(StreamingHistogram(lo=1e-3))


def test_cdf_points_are_monotone_and_end_at_one():
    h = StreamingHistogram()
    h.add_many(np.linspace(0.001, 1.0, 1000))
    x, y = h.cdf_points()
    assert np.all(np.diff(x) > 0) and np.all(np.diff(y) >= 0) and y[-1] == pytest.approx(1.0)


def test_add_seq_and_buffered_gaps_equal_add_float_for_float():
    from fluidpd.core.metrics import GAP_BUFFER, MetricsCollector, Slo

    rng = np.random.default_rng(1)
    xs = [float(x) for x in rng.lognormal(-3.5, 0.9, size=3 * GAP_BUFFER)] + [1e-9, 2e5]  # under lo, over hi
    ws = [int(w) for w in rng.integers(1, 64, size=len(xs))]
    one, seq = StreamingHistogram(), StreamingHistogram()
    for x, w in zip(xs, ws):
        one.add(x, w)
    seq.add_seq(xs, ws)
    assert (one.bins, one.total, one.sum, one.max) == (seq.bins, seq.total, seq.sum, seq.max)
    m = MetricsCollector(Slo(1.0, 0.05))
    direct = StreamingHistogram()
    for i, (x, w) in enumerate(zip(xs, ws)):
        m.on_gap(x, w, handoff=i % 7 == 0)
        if i % 7:
            direct.add(x, w)
    assert (m.tbt.bins, m.tbt.total, m.tbt.sum) == (one.bins, one.total, one.sum)
    assert (m.tbt_decode.bins, m.tbt_decode.total, m.tbt_decode.sum) == (direct.bins, direct.total, direct.sum)
