"""Polynomial fits of step time, e.g. the FluidPD prefill-time curve f_P(s)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fluidpd.latency.roofline import RooflineModel


@dataclass(frozen=True, slots=True)
class Polynomial:
    """p(x) = max(floor, coeffs[0] * x**d + ... + coeffs[d]), evaluated in plain Python (no numpy)."""

    coeffs: tuple[float, ...]  # highest degree first, as numpy.polyfit returns them
    floor: float = float("-inf")  # e.g. the flat, memory-bound time of short prefills

    def __post_init__(self) -> None:
        if not self.coeffs:
            raise ValueError("a polynomial needs at least one coefficient")
        object.__setattr__(self, "coeffs", tuple(float(c) for c in self.coeffs))
        object.__setattr__(self, "floor", float(self.floor))

    def __call__(self, x: float) -> float:
        acc = 0.0
        for c in self.coeffs:  # Horner's rule
            acc = acc * x + c
        return acc if acc > self.floor else self.floor

    def inverse_max(self, budget: float, hi: int, lo: int = 1) -> int:
        """Largest integer x in [lo, hi] with p(x) <= budget, or lo - 1 if there is none.

        Assumes p is non-decreasing on [lo, hi] (binary search), as a time-vs-tokens fit is.
        """
        lo, hi = int(lo), int(hi)
        if hi < lo or self(lo) > budget:
            return lo - 1
        if self(hi) <= budget:
            return hi
        while hi - lo > 1:  # invariant: p(lo) <= budget < p(hi)
            mid = (lo + hi) // 2
            if self(mid) <= budget:
                lo = mid
            else:
                hi = mid
        return lo


def fit_polynomial(xs: Sequence[float], ys: Sequence[float], degree: int = 2, relative: bool = False) -> Polynomial:
    """Least-squares polynomial fit; `relative` weights points by 1/y to bound relative error."""
    import numpy as np

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.size <= degree:
        raise ValueError(f"need matching xs/ys with more than {degree} points")
    w = 1.0 / np.abs(y) if relative else None
    return Polynomial(tuple(float(c) for c in np.polyfit(x, y, degree, w=w)))


def fit_prefill_time(model: RooflineModel, max_tokens: int = 8192, degree: int = 2, points: int = 96) -> Polynomial:
    """f_P(s): prefill time of an s-token prompt (no prior context) over [1, max_tokens].

    Short prompts are memory-bound (time nearly flat at the weight-streaming time), longer
    ones compute-bound; one polynomial cannot follow that knee. So the points are split at
    the knee that minimises the worst relative error: the highest time left of it becomes
    the floor (erring on the slow side) and the polynomial is fitted to the points right of it.
    """
    import numpy as np

    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    grid = np.concatenate([np.geomspace(1, max_tokens, points // 2), np.linspace(1, max_tokens, points // 2)])
    xs = np.unique(grid.round().astype(int))
    ys = np.array([model.prefill_time(int(s)) for s in xs])
    return _fit_with_floor(xs, ys, degree)


def _fit_with_floor(xs, ys, degree: int) -> Polynomial:
    import numpy as np

    best, best_err = fit_polynomial(xs, ys, degree, relative=True), None
    for k in range(0, len(xs) - degree - 1):
        p = fit_polynomial(xs[k:], ys[k:], degree, relative=True)
        if k:
            p = Polynomial(p.coeffs, float(ys[:k].max()))
        err = max(abs(p(float(x)) / y - 1.0) for x, y in zip(xs, ys))
        if best_err is None or err < best_err:
            best, best_err = p, err
    return best
