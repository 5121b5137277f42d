"""Derivative-free minimisation (Nelder-Mead), for fitting a handful of model knobs to measurements."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def nelder_mead(
    f: Callable[[list[float]], float],
    x0: Sequence[float],
    step: float = 0.5,
    iters: int = 200,
    tol: float = 1e-6,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[list[float], float]:
    """Minimise `f` from `x0` (unbounded coordinates: transform bounded knobs first); (x, f(x))."""
    n = len(x0)
    simplex = [list(map(float, x0))] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(x) for x in simplex]
    for it in range(iters):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if progress:
            progress(it, values[0])
        if values[-1] - values[0] < tol:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def toward(a: float, centroid=centroid, worst=worst) -> list[float]:
            return [c + a * (w - c) for c, w in zip(centroid, worst)]

        refl = toward(-1.0)
        fr = f(refl)
        if fr < values[0]:
            exp = toward(-2.0)
            fe = f(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = toward(0.5) if fr >= values[-1] else toward(-0.5)
            fc = f(con)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = con, fc
            else:  # shrink toward the best point
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p)] for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    i = min(range(n + 1), key=values.__getitem__)
    return simplex[i], values[i]
