"""Step points (prefill, decode, mixed) for the profiled latency model, and one decode step's jitter."""

from __future__ import annotations

from statistics import median

from fluidpd.bench.host_profile.config import ProfileConfig
from fluidpd.bench.host_profile.step_bench import StepBench


def _shape(**kw) -> dict:
    base = dict(
        prefill_tokens=0, prefill_seqs=0, prefill_attn_pairs=0.0, prefill_kv_read=0, decode_tokens=0, decode_ctx=0
    )
    base.update(kw)
    return base


def _chunk_shape(c: int, prior: int, **kw) -> dict:
    return _shape(
        prefill_tokens=c, prefill_seqs=1, prefill_attn_pairs=c * prior + c * (c + 1) / 2, prefill_kv_read=prior, **kw
    )


def measure_steps(bench: StepBench, cfg: ProfileConfig, advance) -> list[dict]:
    """Prefill, decode and mixed step points: {kind, shape, seconds, samples}."""
    from fluidpd.engine.plan import PrefillChunk, StepPlan

    points = []
    limit = bench.engine.max_model_len - 2

    def point(kind: str, shape: dict, ts: list[float]) -> None:
        points.append({"kind": kind, "shape": shape, "seconds": median(ts), "samples": ts})

    for prior in cfg.priors:
        for c in (c for c in cfg.chunks if prior + c <= limit):
            ts = []
            for _ in range(cfg.repeats):
                rid = bench.request(prior + c, prior)
                ts.append(bench.timed(StepPlan(prefills=[PrefillChunk(rid, c)])))
                bench.abort([rid])
            point("prefill", _chunk_shape(c, prior), ts)
            advance()
    for n in (n for n in cfg.contexts if n <= limit):
        for b in (b for b in cfg.batches if b * n <= cfg.max_decode_tokens):
            rids = [bench.request(n - 1, n - 1) for _ in range(b)]
            plan = StepPlan(decodes=list(rids))
            bench.timed(plan)  # warm
            ts, ctx = [], []
            for _ in range(cfg.repeats):
                ctx.append(bench.ctx_sum(rids))
                ts.append(bench.timed(plan))
            point("decode", _shape(decode_tokens=b, decode_ctx=int(median(ctx))), ts)
            if n == cfg.mixed_context and b in cfg.mixed_batches:
                for c in cfg.mixed_chunks:
                    ts, ctx = [], []
                    for _ in range(cfg.repeats):
                        r = bench.request(c, 0)
                        ctx.append(bench.ctx_sum(rids))
                        ts.append(bench.timed(StepPlan(prefills=[PrefillChunk(r, c)], decodes=list(rids))))
                        bench.abort([r])
                    point("mixed", _chunk_shape(c, 0, decode_tokens=b, decode_ctx=int(median(ctx))), ts)
            bench.abort(rids)
            advance()
    return points


def measure_jitter(bench: StepBench, steps: int, batch: int = 4, ctx: int = 256) -> dict:
    """One decode step repeated: its percentiles, and delta_guard = 1.5 x (p99.9 - p50)."""
    from fluidpd.engine.plan import StepPlan

    rids = [bench.request(ctx - 1, ctx - 1) for _ in range(batch)]
    plan = StepPlan(decodes=list(rids))
    ts = [bench.timed(plan) for _ in range(steps)]
    bench.abort(rids)
    p50, p99, p999 = median(ts), _quantile(ts, 0.99), _quantile(ts, 0.999)
    return {
        "batch": batch,
        "ctx": ctx,
        "steps": steps,
        "p50_s": p50,
        "p99_s": p99,
        "p999_s": p999,
        "delta_guard_s": 1.5 * (p999 - p50),
        "excess_s": sorted(t - p50 for t in ts),  # the simulator's step noise: drawn from these
    }


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
