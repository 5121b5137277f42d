"""Goodput: the highest rate scale whose SLO attainment still meets the target (binary search)."""

from __future__ import annotations

from collections.abc import Callable


def goodput_rate_scale(
    attainment_at: Callable[[float], float],
    target: float = 0.9,
    start: float = 1.0,
    iters: int = 8,
    max_steps: int = 12,
) -> float:
    """Largest rate scale x with attainment_at(x) >= target, assuming attainment falls with x.

    Brackets by doubling or halving from `start`, then bisects `iters` times (geometric mean).
    Returns 0.0 when even start / 2**max_steps misses the target.
    """
    if not 0 < target <= 1 or start <= 0:
        raise ValueError("target must be in (0, 1] and start > 0")
    lo = hi = None
    x = start
    for _ in range(max_steps):
        if attainment_at(x) >= target:
            lo = x
            if hi is not None:
                break
            x *= 2
        else:
            hi = x
            if lo is not None:
                break
            x /= 2
    if lo is None:
        return 0.0
    if hi is None:
        return lo
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        if attainment_at(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo
