"""A polynomial evaluated in plain Python: cost models the control plane can call."""

from __future__ import annotations

from dataclasses import dataclass


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
