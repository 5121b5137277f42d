"""Step points (prefill, decode, mixed) for the profiled latency model, and one decode step's jitter."""

from __future__ import annotations

import time
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


def step_grid(cfg: ProfileConfig, limit: int) -> list[dict]:
    """The step points in the order they are measured: the chunks after the first prior, the decode
    batches (each with its mixed steps), the chunks after the other priors (what a short budget cuts
    last). Points beyond `limit` tokens of context, or decode batches over max_decode_tokens, are left out."""

    def chunks(prior: int) -> list[dict]:
        return [{"kind": "prefill", "tokens": c, "prior": prior} for c in cfg.chunks if prior + c <= limit]

    first, rest = cfg.priors[:1], cfg.priors[1:]
    decodes = [
        {"kind": "decode", "batch": b, "context": n}
        for n in cfg.contexts
        if n <= limit
        for b in cfg.batches
        if b * n <= cfg.max_decode_tokens
    ]
    return [p for prior in first for p in chunks(prior)] + decodes + [p for prior in rest for p in chunks(prior)]


def measure_steps(
    bench: StepBench,
    cfg: ProfileConfig,
    advance,
    deadline: float | None = None,
    skipped: list | None = None,
    keep_going: bool = False,
) -> list[dict]:
    """Prefill, decode and mixed step points: {kind, shape, seconds, samples}. Past `deadline` (a
    time.monotonic() value) the grid's remaining points are appended to `skipped` instead, and with
    `keep_going` so is a point whose steps fail (out of memory on a GPU), with why."""
    points: list[dict] = []
    for point in step_grid(cfg, bench.engine.max_model_len - 2):
        if deadline is not None and time.monotonic() > deadline:
            if skipped is not None:
                skipped.append(point | {"why": "time budget"})
            continue
        try:
            if point["kind"] == "prefill":
                points.append(_prefill_point(bench, cfg, point["tokens"], point["prior"]))
            else:
                points += _decode_points(bench, cfg, point["batch"], point["context"])
        except Exception as exc:  # noqa: BLE001 - keep_going: the other points still count
            if not keep_going:
                raise
            bench.recover()
            if skipped is not None:
                skipped.append(point | {"why": f"{type(exc).__name__}: {str(exc)[:300]}"})
        advance()
    return points


def _point(kind: str, shape: dict, ts: list[float]) -> dict:
    return {"kind": kind, "shape": shape, "seconds": median(ts), "samples": ts}


def _prefill_point(bench: StepBench, cfg: ProfileConfig, c: int, prior: int) -> dict:
    """One chunk of `c` tokens after `prior` tokens of the same request, `repeats` times."""
    from fluidpd.engine.plan import PrefillChunk, StepPlan

    ts = []
    for _ in range(cfg.repeats):
        rid = bench.request(prior + c, prior)
        ts.append(bench.timed(StepPlan(prefills=[PrefillChunk(rid, c)])))
        bench.abort([rid])
    return _point("prefill", _chunk_shape(c, prior), ts)


def _decode_points(bench: StepBench, cfg: ProfileConfig, b: int, n: int) -> list[dict]:
    """A decode step of `b` sequences of `n` tokens of context (after one warm-up step), and at the
    mixed context the mixed chunks fused into it."""
    from fluidpd.engine.plan import PrefillChunk, StepPlan

    rids = bench.requests(b, n - 1, n - 1, cfg.setup_tokens)
    plan = StepPlan(decodes=list(rids))
    bench.timed(plan)  # warm
    ts, ctx = [], []
    for _ in range(cfg.repeats):
        ctx.append(bench.ctx_sum(rids))
        ts.append(bench.timed(plan))
    points = [_point("decode", _shape(decode_tokens=b, decode_ctx=int(median(ctx))), ts)]
    if n == cfg.mixed_context and b in cfg.mixed_batches:
        for c in cfg.mixed_chunks:
            ts, ctx = [], []
            for _ in range(cfg.repeats):
                r = bench.request(c, 0)
                ctx.append(bench.ctx_sum(rids))
                ts.append(bench.timed(StepPlan(prefills=[PrefillChunk(r, c)], decodes=list(rids))))
                bench.abort([r])
            points.append(_point("mixed", _chunk_shape(c, 0, decode_tokens=b, decode_ctx=int(median(ctx))), ts))
    bench.abort(rids)
    return points


def measure_jitter(bench: StepBench, steps: int, batch: int = 4, ctx: int = 256) -> dict:
    """One decode step repeated: its percentiles, and delta_guard = 1.5 x (p99.9 - p50)."""
    from fluidpd.engine.plan import StepPlan

    rids = bench.requests(batch, ctx - 1, ctx - 1)
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
