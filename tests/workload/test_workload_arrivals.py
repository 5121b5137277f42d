import numpy as np
import pytest

from fluidpd.workload import arrival_times, gamma, onoff, poisson


def cv(x):
    gaps = np.diff(x)
    return gaps.std() / gaps.mean()


def test_poisson_rate_and_cv():
    t = poisson(5.0, n=100_000, seed=1)
    assert t.dtype == np.float64 and len(t) == 100_000 and (np.diff(t) >= 0).all()
    assert len(t) / t[-1] == pytest.approx(5.0, rel=0.02)
    assert cv(t) == pytest.approx(1.0, abs=0.02)


def test_poisson_by_duration_stays_inside_window():
    t = poisson(20.0, duration_s=2000.0, seed=3)
    assert t.max() < 2000.0 and t.min() >= 0
    assert len(t) == pytest.approx(40_000, rel=0.03)
    assert len(poisson(20.0, duration_s=0.0)) == 0


@pytest.mark.parametrize("knob", [0.5, 2.0, 4.0])
def test_gamma_cv_matches_knob(knob):
    t = gamma(10.0, knob, n=200_000, seed=2)
    assert cv(t) == pytest.approx(knob, rel=0.05)
    assert len(t) / t[-1] == pytest.approx(10.0, rel=0.05)


def test_gamma_zero_cv_is_deterministic():
    np.testing.assert_allclose(gamma(4.0, 0.0, n=4), [0.25, 0.5, 0.75, 1.0])


def test_onoff_is_silent_during_off_periods():
    t = onoff(50.0, on_s=2.0, off_s=8.0, duration_s=1000.0, seed=4)
    assert t.max() < 1000.0
    assert (t % 10.0 < 2.0).all()
    assert len(t) / 1000.0 == pytest.approx(50.0 * 2 / 10, rel=0.05)
    counts = np.bincount((t // 1.0).astype(int), minlength=1000)
    assert counts.reshape(100, 10)[:, 2:].sum() == 0 and counts.reshape(100, 10)[:, :2].min() > 0


def test_onoff_by_count():
    t = onoff(10.0, 1.0, 4.0, n=5000, seed=0)
    assert len(t) == 5000 and (np.diff(t) >= 0).all() and (t % 5.0 < 1.0).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda s: poisson(3.0, n=1000, seed=s),
        lambda s: gamma(3.0, 2.0, duration_s=300.0, seed=s),
        lambda s: onoff(3.0, 1.0, 1.0, n=1000, seed=s),
    ],
)
def test_seeding(make):
    np.testing.assert_array_equal(make(7), make(7))
    a, b = make(7), make(8)
    assert len(a) != len(b) or not np.array_equal(a, b)


@pytest.mark.parametrize(
    "call",
    [
        lambda: poisson(0.0, n=10),
        lambda: poisson(-1.0, n=10),
        lambda: poisson(1.0),
        lambda: poisson(1.0, n=10, duration_s=5.0),
        lambda: poisson(1.0, n=-1),
        lambda: poisson(1.0, duration_s=float("inf")),
        lambda: gamma(1.0, -0.5, n=10),
        lambda: onoff(1.0, 0.0, 1.0, n=10),
        lambda: onoff(1.0, 1.0, -1.0, n=10),
        lambda: arrival_times("weibull", 1.0, n=10),
    ],
)
def test_bad_arguments(call):
    with pytest.raises(ValueError):
        call()
