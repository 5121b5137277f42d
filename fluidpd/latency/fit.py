"""Polynomial fits of step time, e.g. the FluidPD prefill-time curve f_P(s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluidpd.core.polynomial import Polynomial
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["Polynomial", "fit_chunk_time", "fit_polynomial", "fit_prefill_time"]


def fit_polynomial(xs: ArrayLike, ys: ArrayLike, degree: int = 2, relative: bool = False) -> Polynomial:
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
    best, best_err = fit_polynomial(xs, ys, degree, relative=True), None
    for k in range(0, len(xs) - degree - 1):
        p = fit_polynomial(xs[k:], ys[k:], degree, relative=True)
        if k:
            p = Polynomial(p.coeffs, float(ys[:k].max()))
        err = max(abs(p(float(x)) / y - 1.0) for x, y in zip(xs, ys))
        if best_err is None or err < best_err:
            best, best_err = p, err
    return best


def fit_chunk_time(
    model: RooflineModel,
    batch: int = 1,
    ctx: int = 1024,
    max_tokens: int = 8192,
    degree: int = 2,
    points: int = 96,
    absolute_below_s: float = 0.1,
) -> Polynomial:
    """Marginal time of a prefill chunk of c tokens fused into a decode step of `batch` requests.

    FluidToken runs a borrowed chunk in the same forward pass as the decode batch, so the
    weights are streamed once: until the dense layers turn compute-bound the chunk is nearly
    free, then it costs its FLOPs. Fitted like f_P, with the flat part as the floor, minimising the
    error relative to max(time, `absolute_below_s`): below that (what fits in a TBT slack) the error
    counts in absolute terms, so the fit follows the knee where FluidToken's chunks live instead of
    the relative error of near-free ones.
    """
    import numpy as np

    if batch < 1 or max_tokens < 1:
        raise ValueError("batch and max_tokens must be >= 1")
    base = model.step_time(StepShape(decode_tokens=batch, decode_ctx=batch * ctx))
    grid = np.concatenate([np.geomspace(1, max_tokens, points // 2), np.linspace(1, max_tokens, points // 2)])
    xs = np.unique(grid.round().astype(int))
    times = []
    for c in xs:
        shape = StepShape(decode_tokens=batch, decode_ctx=batch * ctx)
        shape.add_chunk(int(c), 0)
        times.append(model.step_time(shape) - base)
    ys = np.array(times)
    scale = np.maximum(ys, absolute_below_s)
    best, best_err = None, None
    for k in range(0, len(xs) - degree - 1):  # knee: fit right of it, floor 0 left of it
        p = Polynomial(fit_polynomial(xs[k:], ys[k:], degree).coeffs, 0.0)
        err = max(abs(p(float(x)) - y) / s for x, y, s in zip(xs, ys, scale))
        if best_err is None or err < best_err:
            best, best_err = p, err
    if best is None:
        raise ValueError(f"{points} points leave no knee to search for a degree-{degree} fit")
    return best


def fit_attention_pair_time(model: RooflineModel, chunk: int = 256, prior: int = 4096) -> float:
    """Attention time of one query-key pair: how much dearer a chunk gets per earlier token it
    attends to (a chunk of `chunk` tokens after `prior` against the same chunk after none)."""
    if chunk < 1 or prior < 1:
        raise ValueError("chunk and prior must be >= 1")
    alone, after = StepShape(), StepShape()
    alone.add_chunk(chunk, 0)
    after.add_chunk(chunk, prior)
    return max(0.0, (model.step_time(after) - model.step_time(alone)) / (chunk * prior))
