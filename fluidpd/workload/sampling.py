"""Pair a pool of (prompt, output) lengths with an arrival process: DistServe's "resample a synthetic workload"."""

from __future__ import annotations

import numpy as np

from fluidpd.workload.arrivals import Seed, arrival_times
from fluidpd.workload.trace import Trace


def sample_requests(
    prompt_pool: np.ndarray,
    output_pool: np.ndarray,
    rate: float,
    *,
    n: int | None = None,
    duration_s: float | None = None,
    arrivals: str = "poisson",
    cv: float = 1.0,
    seed: Seed = 0,
    name: str = "sampled",
) -> Trace:
    """The whole pool in order when neither `n` nor `duration_s` is given; else lengths drawn with replacement."""
    prompt_pool, output_pool = np.asarray(prompt_pool), np.asarray(output_pool)
    if prompt_pool.shape != output_pool.shape or prompt_pool.ndim != 1 or not len(prompt_pool):
        raise ValueError(
            f"length pools must be non-empty and equally long, got {prompt_pool.shape}, {output_pool.shape}"
        )
    rng = np.random.default_rng(seed)
    whole_pool = n is None and duration_s is None
    t = arrival_times(arrivals, rate, cv=cv, n=len(prompt_pool) if whole_pool else n, duration_s=duration_s, seed=rng)
    rows = slice(None) if whole_pool else rng.integers(0, len(prompt_pool), len(t))
    return Trace(name, t, prompt_pool[rows], output_pool[rows], span_s=duration_s)


def resample(trace: Trace, rate: float, **kw) -> Trace:
    """A new workload with `trace`'s length distribution and fresh arrivals (kw as in sample_requests)."""
    kw.setdefault("name", f"{trace.name}@{rate:g}rps")
    return sample_requests(trace.prompt_len, trace.output_len, rate, **kw)
