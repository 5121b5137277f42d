"""Seeded arrival processes: Poisson, Gamma (CV knob) and on/off bursts. Times in seconds, float64.

Each takes exactly one of `n` (that many arrivals) or `duration_s` (every arrival in [0, duration_s)).
`seed` is an int or a numpy Generator (which is then advanced).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Seed = int | np.random.Generator
ARRIVAL_KINDS = ("poisson", "gamma")


def poisson(rate: float, n: int | None = None, duration_s: float | None = None, seed: Seed = 0) -> np.ndarray:
    """Poisson arrivals at `rate` req/s (exponential gaps, CV 1)."""
    _check_rate(rate)
    return _renewal(lambda rng, k: rng.exponential(1.0 / rate, k), rate, n, duration_s, seed)


def gamma(rate: float, cv: float, n: int | None = None, duration_s: float | None = None, seed: Seed = 0) -> np.ndarray:
    """Renewal arrivals with Gamma gaps of mean 1/rate and coefficient of variation `cv` (shape 1/cv^2)."""
    _check_rate(rate)
    if not (cv >= 0 and np.isfinite(cv)):
        raise ValueError(f"cv must be >= 0, got {cv}")
    if cv == 0:
        return _renewal(lambda rng, k: np.full(k, 1.0 / rate), rate, n, duration_s, seed)
    shape = 1.0 / cv**2
    return _renewal(lambda rng, k: rng.gamma(shape, 1.0 / (rate * shape), k), rate, n, duration_s, seed)


def onoff(
    rate_on: float, on_s: float, off_s: float, n: int | None = None, duration_s: float | None = None, seed: Seed = 0
) -> np.ndarray:
    """Bursts: Poisson at `rate_on` during each `on_s` period, silence for `off_s`, repeating from an on period."""
    if not (on_s > 0 and off_s >= 0):
        raise ValueError(f"onoff needs on_s > 0 and off_s >= 0, got on_s={on_s}, off_s={off_s}")
    _check_count(n, duration_s)
    if duration_s is not None:
        cycles, rest = divmod(duration_s, on_s + off_s)
        duration_s = cycles * on_s + min(rest, on_s)  # on-time inside the window
    busy = poisson(rate_on, n, duration_s, seed)
    return busy + np.floor(busy / on_s) * off_s  # map on-time to wall time


def arrival_times(
    kind: str, rate: float, *, cv: float = 1.0, n: int | None = None, duration_s: float | None = None, seed: Seed = 0
) -> np.ndarray:
    """Dispatch by name: 'poisson' or 'gamma' (with `cv`)."""
    if kind == "poisson":
        return poisson(rate, n, duration_s, seed)
    if kind == "gamma":
        return gamma(rate, cv, n, duration_s, seed)
    raise ValueError(f"unknown arrival process {kind!r}; valid: {', '.join(ARRIVAL_KINDS)}")


def _renewal(
    gaps: Callable[[np.random.Generator, int], np.ndarray],
    rate: float,
    n: int | None,
    duration_s: float | None,
    seed: Seed,
) -> np.ndarray:
    _check_count(n, duration_s)
    rng = np.random.default_rng(seed)
    if n is not None:
        return np.cumsum(gaps(rng, n))
    assert duration_s is not None  # _check_count: exactly one of n and duration_s
    expected = rate * duration_s
    chunk = int(expected + 6 * np.sqrt(expected) + 16)
    parts, t = [], 0.0
    while True:
        times = t + np.cumsum(gaps(rng, chunk))
        parts.append(times[times < duration_s])
        if times[-1] >= duration_s:
            return np.concatenate(parts)
        t = times[-1]


def _check_rate(rate: float) -> None:
    if not (rate > 0 and np.isfinite(rate)):
        raise ValueError(f"arrival rate must be a positive finite req/s, got {rate}")


def _check_count(n: int | None, duration_s: float | None) -> None:
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n (number of arrivals) or duration_s")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if duration_s is not None and not (duration_s >= 0 and np.isfinite(duration_s)):
        raise ValueError(f"duration_s must be >= 0 and finite, got {duration_s}")
