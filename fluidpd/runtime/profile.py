"""Cost models fitted on the real engine: f_P(s), the fused-chunk time, and L_m."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fluidpd.core.polynomial import Polynomial


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Measured step times of one engine and the fits the control plane uses."""

    prefill_points: tuple[tuple[int, float], ...]  # (prompt tokens, seconds)
    chunk_points: tuple[tuple[int, float], ...]  # (chunk tokens, seconds over a 1-request decode step)
    decode_step_s: float
    prefill_time: Polynomial
    chunk_time: Polynomial
    prefill_batch_tokens: int  # L_m

    def summary(self, threads: int) -> dict:
        """What `/v1/admin/cluster` and the benchmarks report of it: a 512-token prefill, a one-request
        decode step, L_m, at `threads` torch threads a worker."""
        return {
            "prefill_512_s": self.prefill_time(512),
            "decode_step_s": self.decode_step_s,
            "prefill_batch_tokens": self.prefill_batch_tokens,
            "threads": threads,
        }


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def profile_engine(engine, lengths=(16, 64, 128, 256, 512), repeats: int = 3) -> EngineProfile:
    """Time prefills of `lengths` tokens and the same chunks fused into a decode step, in `engine`
    (an LLMEngine in this process, used before it serves)."""
    from fluidpd.engine.plan import PrefillChunk, StepPlan
    from fluidpd.engine.sampling import SamplingParams
    from fluidpd.latency.fit import fit_polynomial

    lengths = [n for n in lengths if n < engine.max_model_len - 2]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prefill, chunk = [], []
    for n in lengths:
        p, c = [], []
        for r in range(repeats):
            a = engine.add_request(list(range(100, 100 + n)), params, request_id=f"profile-a-{n}-{r}")
            t0 = time.perf_counter()
            engine.run_step(StepPlan(prefills=[PrefillChunk(a, n)]))
            p.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            engine.run_step(StepPlan(decodes=[a]))
            decode = time.perf_counter() - t0
            b = engine.add_request(list(range(200, 200 + n)), params, request_id=f"profile-b-{n}-{r}")
            t0 = time.perf_counter()
            engine.run_step(StepPlan(prefills=[PrefillChunk(b, n)], decodes=[a]))
            c.append(max(time.perf_counter() - t0 - decode, 0.0))
            engine.abort(a)
            engine.abort(b)
        prefill.append((n, _median(p)))
        chunk.append((n, _median(c)))
    decode_s = decode_step_time(engine, repeats)
    xs = [n for n, _ in prefill]
    f_p = Polynomial(fit_polynomial(xs, [t for _, t in prefill], 2, relative=True).coeffs, 0.0)
    g = Polynomial(fit_polynomial(xs, [t for _, t in chunk], 2).coeffs, 0.0)
    per_token = [(n, t / n) for n, t in prefill]
    best = min(t for _, t in per_token)
    l_m = next(n for n, t in per_token if t <= best * 1.1)
    return EngineProfile(tuple(prefill), tuple(chunk), decode_s, f_p, g, l_m)


def decode_step_time(engine, repeats: int = 3) -> float:
    """The median time of a one-request decode step (a 4-token prompt) in `engine`."""
    from fluidpd.engine.plan import PrefillChunk, StepPlan
    from fluidpd.engine.sampling import SamplingParams

    a = engine.add_request(
        [1, 2, 3, 4], SamplingParams(max_tokens=repeats + 2, ignore_eos=True), request_id="profile-d"
    )
    engine.run_step(StepPlan(prefills=[PrefillChunk(a, 4)]))
    d = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.run_step(StepPlan(decodes=[a]))
        d.append(time.perf_counter() - t0)
    engine.abort(a)
    return _median(d)
