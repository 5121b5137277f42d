"""A workload model fitted to a trace window and resampled at any rate (DistServe Section V).

Lengths: the window's (prompt, output) pairs, drawn with replacement (the empirical joint
distribution). Arrivals: a renewal process whose gaps match the window's mean and coefficient of
variation (Poisson when the CV is near 1, Gamma otherwise). Or the window itself, replayed with its
own arrival pattern (`fit(trace, replay=True)`). `sample` gives what one instance of a deployment
serving the whole workload sees at a given share of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fluidpd.workload.sampling import sample_requests
from fluidpd.workload.trace import Trace

POISSON_CV_BAND = 0.1  # a CV this close to 1 is taken as Poisson


@dataclass(frozen=True, slots=True, eq=False)
class WorkloadModel:
    """Length pairs and an arrival process (rate, CV of the gaps) fitted to one trace window."""

    name: str
    prompt_len: np.ndarray
    output_len: np.ndarray
    rate: float
    cv: float
    replay: Trace | None = None

    @classmethod
    def fit(cls, trace: Trace, replay: bool = False) -> WorkloadModel:
        if len(trace) < 2:
            raise ValueError(f"fitting a workload needs at least 2 requests, {trace.name!r} has {len(trace)}")
        gaps = np.diff(trace.arrival_s)
        mean = float(gaps.mean())
        cv = float(gaps.std() / mean) if mean > 0 else 1.0
        lengths = trace.prompt_len.copy(), trace.output_len.copy()
        return cls(trace.name, *lengths, trace.mean_rate, cv, trace if replay else None)

    @property
    def arrivals(self) -> str:
        if self.replay is not None:
            return "replay"
        return "poisson" if abs(self.cv - 1.0) <= POISSON_CV_BAND else "gamma"

    def at_rate(self, rate: float) -> WorkloadModel:
        """The same workload arriving at `rate` req/s in all (a deployment's target R)."""
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        return dataclasses.replace(self, rate=float(rate))

    def sample(self, rate: float, n: int, seed: int = 0, output_len: int | None = None) -> Trace:
        """`n` requests as one instance serving `rate` req/s of this workload sees them (outputs of
        `output_len` tokens, if given: a phase alone).

        Below the workload's own rate the instance gets a random share of the whole stream
        (thinning), so a burst of the stream reaches it scaled down, as a dispatcher spreads it; at
        or above it, the whole stream compressed in time.
        """
        if not rate > 0 or n < 1:
            raise ValueError(f"sampling needs rate > 0 and n >= 1, got {rate}, {n}")
        keep = min(1.0, rate / self.rate)
        total = max(n, int(np.ceil(n / keep * 1.05)) + 16)
        rng = np.random.default_rng(seed)
        stream = self._stream(max(rate, self.rate), total, rng)
        rows = np.flatnonzero(rng.random(len(stream)) < keep)[:n] if keep < 1.0 else np.arange(min(n, len(stream)))
        outputs = stream.output_len[rows] if output_len is None else np.full(len(rows), output_len)
        return Trace(f"{self.name}~{rate:.3g}rps", stream.arrival_s[rows], stream.prompt_len[rows], outputs)

    def _stream(self, rate: float, n: int, rng: np.random.Generator) -> Trace:
        """`n` requests of the whole workload at `rate`: fitted arrivals, or the window replayed
        (repeated end to end when it is shorter)."""
        if self.replay is None:
            return sample_requests(
                self.prompt_len, self.output_len, rate, n=n, arrivals=self.arrivals, cv=self.cv, seed=rng
            )
        w = self.replay.scale_rate(rate / self.rate)
        laps = int(np.ceil(n / len(w)))
        span = max(w.duration_s, float(w.arrival_s[-1]) + 1.0 / rate)
        arrival = np.concatenate([w.arrival_s + i * span for i in range(laps)])[:n]
        prompt, output = np.tile(w.prompt_len, laps)[:n], np.tile(w.output_len, laps)[:n]
        return Trace(w.name, arrival, prompt, output)

    def describe(self) -> dict:
        p, o = self.prompt_len, self.output_len
        return {
            "requests": len(p),
            "rate_rps": self.rate,
            "arrival_cv": self.cv,
            "arrivals": self.arrivals,
            "prompt_mean": float(p.mean()),
            "prompt_p99": float(np.percentile(p, 99)),
            "output_mean": float(o.mean()),
            "output_p99": float(np.percentile(o, 99)),
        }
