"""Synthetic workloads: parametric lengths, DistServe's fixed-length example, FluidPD's phase-shift pattern."""

from __future__ import annotations

import numpy as np

from fluidpd.workload.arrivals import Seed, arrival_times
from fluidpd.workload.loaders import load_lengths
from fluidpd.workload.sampling import sample_requests
from fluidpd.workload.trace import Trace, compose, draw_constrained

# A length is an int (constant), ("uniform", lo, hi) inclusive, or ("lognormal", mean, sigma[, max]):
# mean of the token counts, sigma of the underlying normal, optional cap.
LengthSpec = int | tuple


def sample_lengths(spec: LengthSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """n token counts (int64, >= 1) drawn from `spec`."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"a constant length must be >= 1, got {spec}")
        return np.full(n, spec, dtype=np.int64)
    parts = tuple(spec) if isinstance(spec, (tuple, list)) else ()
    kind = parts[0] if parts else None
    if kind == "uniform" and len(parts) == 3 and 1 <= parts[1] <= parts[2]:
        return rng.integers(parts[1], parts[2], n, endpoint=True, dtype=np.int64)
    if kind == "lognormal" and len(parts) in (3, 4) and parts[1] >= 1 and parts[2] >= 0:
        mean, sigma = float(parts[1]), float(parts[2])
        x = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)
        cap = parts[3] if len(parts) == 4 else np.inf
        return np.clip(np.rint(x), 1, cap).astype(np.int64)
    raise ValueError(
        f"bad length spec {spec!r}: use an int >= 1, ('uniform', lo, hi) with 1 <= lo <= hi, "
        "or ('lognormal', mean >= 1, sigma >= 0[, max])"
    )


def synthetic(
    n: int,
    rate: float,
    prompt_len: LengthSpec = ("lognormal", 1024, 0.8),
    output_len: LengthSpec = ("lognormal", 256, 0.8),
    *,
    arrivals: str = "poisson",
    cv: float = 1.0,
    seed: Seed = 0,
    name: str = "synthetic",
    samples: LengthSpec = 1,
    constrained: float = 0.0,
) -> Trace:
    """n requests with lengths from the given specs and Poisson or Gamma(cv) arrivals at `rate` req/s;
    `samples`: sequences each samples from its one prefill (a request group when > 1; a spec like a length's);
    `constrained`: the share of requests whose output a grammar constrains (structured outputs)."""
    rng = np.random.default_rng(seed)
    t = arrival_times(arrivals, rate, cv=cv, n=n, seed=rng)
    trace = Trace(name, t, sample_lengths(prompt_len, n, rng), sample_lengths(output_len, n, rng))
    if samples != 1:  # (drawn after the lengths: a trace without groups is unchanged)
        trace.n = sample_lengths(samples, n, rng)
    if constrained:
        trace.constrained = draw_constrained(n, constrained, rng)
    return trace


def fixed_lengths(n: int, rate: float, prompt: int = 512, output: int = 64, *, seed: Seed = 0) -> Trace:
    """DistServe's example: uniform `prompt`-in / `output`-out requests with Poisson arrivals."""
    return synthetic(n, rate, prompt, output, seed=seed, name=f"fixed_{prompt}_{output}")


def phase_shift(
    phase_s: float = 60.0,
    *,
    surge_rate: float = 8.0,
    wave_rate: float = 3.0,
    cycles: int = 1,
    gap_s: float = 0.0,
    seed: Seed = 0,
) -> Trace:
    """FluidPD's two imbalance patterns back to back, `cycles` times, each phase lasting `phase_s` seconds.

    Pattern 1, prompt ingress surge: arXiv-summarisation lengths (prompt >> output) at `surge_rate`.
    Pattern 2, deep generation wave: BWB translation lengths (output >> prompt) at `wave_rate`.
    Lengths are drawn with replacement, arrivals are Poisson; one seed drives everything.
    """
    if not (phase_s > 0 and cycles >= 1):
        raise ValueError(f"phase_shift needs phase_s > 0 and cycles >= 1, got {phase_s}, {cycles}")
    rng = np.random.default_rng(seed)
    surge, wave = load_lengths(kind="arxiv_sum"), load_lengths(kind="bwb")
    phases = []
    for _ in range(cycles):
        phases.append(sample_requests(*surge, surge_rate, duration_s=phase_s, seed=rng, name="surge"))
        phases.append(sample_requests(*wave, wave_rate, duration_s=phase_s, seed=rng, name="wave"))
    return compose(phases, gap_s, name="phase_shift")
