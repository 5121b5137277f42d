import numpy as np
import pytest

from fluidpd.workload import fixed_lengths, load_azure, phase_shift, resample, sample_lengths, synthetic


def test_million_request_trace():  # its build time is part of benchmarks/simulation/sim_speed.py
    t = synthetic(1_000_000, 200.0, ("lognormal", 1024, 1.0, 32_000), ("uniform", 1, 512), seed=0)
    assert len(t) == 1_000_000 and t.mean_rate == pytest.approx(200.0, rel=0.01)
    assert t.prompt_len.mean() == pytest.approx(1024, rel=0.02) and t.prompt_len.max() <= 32_000
    assert t.output_len.min() >= 1 and t.output_len.max() <= 512
    assert t.arrival_s.nbytes + t.prompt_len.nbytes + t.output_len.nbytes == 24_000_000


def test_fixed_lengths_is_distserve_example():
    t = fixed_lengths(20_000, 4.0, seed=1)
    assert (t.prompt_len == 512).all() and (t.output_len == 64).all()
    gaps = np.diff(t.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert t.mean_rate == pytest.approx(4.0, rel=0.03)


def test_gamma_arrivals_in_synthetic():
    t = synthetic(50_000, 10.0, 100, 10, arrivals="gamma", cv=3.0, seed=0)
    gaps = np.diff(t.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_sample_lengths_specs():
    rng = np.random.default_rng(0)
    assert (sample_lengths(7, 5, rng) == 7).all()
    u = sample_lengths(["uniform", 3, 5], 10_000, rng)
    assert set(np.unique(u)) == {3, 4, 5}
    ln = sample_lengths(("lognormal", 300, 0.5), 100_000, rng)
    assert ln.mean() == pytest.approx(300, rel=0.02) and ln.min() >= 1
    for bad in (0, ("uniform", 5, 3), ("uniform", 0, 3), ("lognormal", 0, 1), ("normal", 1, 2), "x", True):
        with pytest.raises(ValueError, match=r"length spec|constant length"):
            sample_lengths(bad, 3, rng)


def test_synthetic_seeding():
    a, b = synthetic(1000, 5.0, seed=3), synthetic(1000, 5.0, seed=3)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.prompt_len, b.prompt_len)
    c = synthetic(1000, 5.0, seed=4)
    assert not np.array_equal(a.arrival_s, c.arrival_s) and not np.array_equal(a.prompt_len, c.prompt_len)


def test_phase_shift_alternates_surge_and_wave():
    t = phase_shift(30.0, surge_rate=8.0, wave_rate=2.0, cycles=2, seed=0)
    assert t.duration_s == 120.0 and (np.diff(t.arrival_s) >= 0).all()
    surge, wave = t.window(0, 30), t.window(30, 30)
    assert surge.mean_rate == pytest.approx(8.0, rel=0.25) and wave.mean_rate == pytest.approx(2.0, rel=0.4)
    assert np.median(surge.prompt_len / surge.output_len) > 5  # prompt >> output
    assert np.median(wave.prompt_len / wave.output_len) < 1  # output >> prompt
    assert wave.output_len.mean() > 4 * surge.output_len.mean()
    assert t.window(60, 30).mean_rate > 2 * t.window(90, 30).mean_rate  # second cycle repeats the pattern
    same = phase_shift(30.0, surge_rate=8.0, wave_rate=2.0, cycles=2, seed=0)
    np.testing.assert_array_equal(t.arrival_s, same.arrival_s)
    other = phase_shift(30.0, surge_rate=8.0, wave_rate=2.0, cycles=2, seed=1)
    assert len(other) != len(t) or not np.array_equal(other.arrival_s, t.arrival_s)


def test_phase_shift_gap_and_bad_arguments():
    t = phase_shift(10.0, gap_s=5.0, seed=0)
    assert t.duration_s == 25.0 and not ((t.arrival_s >= 10) & (t.arrival_s < 15)).any()
    for kw in ({"phase_s": 0}, {"cycles": 0}, {"surge_rate": -1.0}):
        with pytest.raises(ValueError):
            phase_shift(**kw)


def test_resample_keeps_length_distribution():
    az = load_azure(kind="conv")
    r = resample(az, 20.0, n=50_000, seed=0)
    assert len(r) == 50_000 and r.mean_rate == pytest.approx(20.0, rel=0.02)
    assert r.prompt_len.mean() == pytest.approx(az.prompt_len.mean(), rel=0.03)
    assert np.isin(r.output_len, az.output_len).all()
