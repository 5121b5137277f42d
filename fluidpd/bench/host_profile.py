"""`fluidpd profile`: the real engine measured on this host, for the simulator's profiled latency model.

Each step point is the median of `repeats` timed `run_step` calls, recorded with its step shape
(the fields of `fluidpd.latency.shape.StepShape`):

  prefill   one chunk of c tokens after p tokens of earlier context
  decode    b sequences of n tokens of context each (b * n <= max_decode_tokens)
  mixed     a chunk of c fresh tokens fused into a decode step of b sequences

Then: step-time jitter (one decode step repeated: p50, p99, p99.9; delta_guard = 1.5 x the p99.9
excess; the excess of every sample over the median is the simulator's step noise), the serving
runtime's per-step dispatch overhead (plans sent to a worker process of the process backend),
KV hand-off bandwidth (export, shared-memory transport, import into a second engine),
FluidRole's remap (`resize_kv` shrinking and growing around live KV), and contention: a decode
and a prefill step timed while k = 1..workers worker processes run steps at once (of the same
kind, and of the other kind).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import random
import time
from dataclasses import asdict, dataclass, replace
from statistics import median

from fluidpd.core.cpu import cpu_name
from fluidpd.core.knobs import knob

PROFILE_VERSION = 2


@dataclass
class ProfileConfig:
    """What `fluidpd profile` measures, and how often."""

    workers: int = knob(4, "contention: time steps while 1..N worker processes are busy at once")
    repeats: int = knob(5, "timed steps per point (their median is the point)")
    chunks: tuple[int, ...] = (8, 32, 128, 256, 512, 1024, 2048)
    priors: tuple[int, ...] = (0, 512, 1536)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (64, 256, 1024, 2048)
    max_decode_tokens: int = knob(8192, "largest decode batch x context profiled")
    mixed_chunks: tuple[int, ...] = (32, 128, 512)
    mixed_batches: tuple[int, ...] = (1, 8)  # decode batches the mixed chunks join ...
    mixed_context: int = 256  # ... at this context (one of `contexts`)
    jitter_steps: int = knob(1000, "repeats of one decode step for the jitter percentiles (and the simulator's noise)")
    dispatch_steps: int = knob(30, "steps of each kind sent to a worker process for the runtime's per-step overhead")
    contention_s: float = knob(2.0, "seconds each contention level runs")
    contention_rounds: int = knob(2, "rounds of the contention levels (each level's median is kept)")
    transfer_tokens: tuple[int, ...] = (128, 512, 2048)
    # fresh shared-memory segments fault in at 2-5x a memcpy now and then: a median of many
    transfer_repeats: int = knob(9, "KV hand-offs per request size (their median is the point)")

    def __post_init__(self) -> None:
        if (
            min(self.workers, self.repeats, self.transfer_repeats, self.dispatch_steps, self.contention_rounds) < 1
            or self.jitter_steps < 10
            or self.contention_s <= 0
        ):
            raise ValueError(
                "workers, repeats, transfer_repeats, dispatch_steps and contention_rounds must be >= 1, "
                "jitter_steps >= 10, contention_s > 0"
            )


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class _Bench:
    """One engine on this process's thread, with helpers that build and time steps."""

    def __init__(self, engine, seed: int) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self._n = 0

    def request(self, prompt_len: int, computed: int) -> str:
        """A request of `prompt_len` random tokens whose first `computed` are prefilled (in chunks
        of at most 2048); with computed == prompt_len it has sampled its first token and decodes."""
        from fluidpd.engine.plan import PrefillChunk, StepPlan
        from fluidpd.engine.sampling import SamplingParams

        self._n += 1
        ids = [self.rng.randint(100, 40000) for _ in range(prompt_len)]
        rid = self.engine.add_request(ids, SamplingParams(max_tokens=1 << 20, ignore_eos=True), f"profile-{self._n}")
        done = 0
        while done < computed:
            c = min(2048, computed - done)
            self.engine.run_step(StepPlan(prefills=[PrefillChunk(rid, c)]))
            done += c
        return rid

    def ctx_sum(self, rids: list[str]) -> int:
        """KV tokens a decode step of `rids` attends to."""
        return sum(self.engine.request(r).num_computed + 1 for r in rids)

    def timed(self, plan) -> float:
        t0 = time.perf_counter()
        self.engine.run_step(plan)
        return time.perf_counter() - t0

    def abort(self, rids) -> None:
        for r in rids:
            self.engine.abort(r)


def _with_blocks(engine_config, blocks: int):
    """`engine_config` with room for at least `blocks` KV blocks, whatever its arena."""
    return replace(engine_config, num_kv_blocks=max(engine_config.num_kv_blocks or 0, blocks), arena_bytes=None)


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


def measure_steps(bench: _Bench, cfg: ProfileConfig, advance) -> list[dict]:
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


def measure_jitter(bench: _Bench, steps: int, batch: int = 4, ctx: int = 256) -> dict:
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


def measure_dispatch(engine_config, repeats: int) -> dict:
    """The serving runtime's overhead per step: a worker process of the process backend runs
    decode steps (batch 1 and 8) and 256-token prefills sent from here; the wall time from sending
    the plan to having its result, less the engine's own step time (pickling, the pipe, threads)."""
    from fluidpd.engine.plan import PrefillChunk, StepPlan
    from fluidpd.engine.sampling import SamplingParams
    from fluidpd.runtime.backend import make_worker

    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    worker = make_worker("process", 0, _with_blocks(engine_config, 256))  # 8 x 256 decoding + a prefill
    try:
        worker.start()

        def overhead(plan) -> float:
            t0 = time.perf_counter()
            res = worker.submit("run_step", plan).result()
            return time.perf_counter() - t0 - res.step_s

        ids = [worker.submit("add_request", f"d{i}", list(range(100, 356)), params).result() for i in range(8)]
        for rid in ids:
            worker.submit("run_step", StepPlan(prefills=[PrefillChunk(rid, 256)])).result()
        decode = [overhead(StepPlan(decodes=ids[:b])) for b in (1, 8) for _ in range(repeats)]
        prefill = []
        for i in range(repeats):
            rid = worker.submit("add_request", f"p{i}", list(range(200, 456)), params).result()
            prefill.append(overhead(StepPlan(prefills=[PrefillChunk(rid, 256)])))
            worker.submit("abort", rid).result()
        return {"decode_s": median(decode), "prefill_s": median(prefill), "steps": len(decode) + len(prefill)}
    finally:
        worker.close()


def measure_transfer(bench: _Bench, other, tokens: tuple[int, ...], repeats: int) -> dict:
    """KV hand-off of requests of `tokens` tokens between two engines: export, the shared-memory
    transport's send and receive, import; fitted as latency + bytes / bandwidth (least relative
    error: each size counts alike), with the share of the time spent on the source side (export
    and send: the rest is the destination's)."""
    import numpy as np

    from fluidpd.runtime.transport import get_transport

    shm = get_transport("shm")
    kv_tokens = bench.engine.blocks.num_blocks * bench.engine.config.block_size
    points = []
    for n in (n for n in tokens if n + 16 < min(kv_tokens, bench.engine.max_model_len)):
        rid = bench.request(n, n)
        src, dst, ts, sent, nbytes = bench.engine, other, [], [], 0
        for i in range(repeats + 1):  # the first round trip is a warm-up (fresh segments fault in)
            t0 = time.perf_counter()
            payload = src.export_kv(rid)
            handle = shm.send(payload)
            t1 = time.perf_counter()
            try:
                dst.import_kv(shm.receive(handle))
            finally:
                shm.release(handle)
            if i:
                ts.append(time.perf_counter() - t0)
                sent.append(t1 - t0)
            nbytes = payload.nbytes
            src, dst = dst, src
        src.abort(rid)
        points.append({"tokens": n, "bytes": nbytes, "seconds": median(ts), "export_s": median(sent)})
    if len(points) < 2:
        raise ValueError("KV transfer needs two request sizes that fit the engine's KV")
    seconds = np.array([p["seconds"] for p in points])
    slope, intercept = np.polyfit([p["bytes"] for p in points], seconds, 1, w=1 / seconds)  # relative error
    share = sum(p["export_s"] for p in points) / sum(p["seconds"] for p in points)
    return {
        "points": points,
        "bandwidth_Bps": 1.0 / max(slope, 1e-15),
        "latency_s": max(0.0, float(intercept)),
        "export_share": share,
    }


def measure_remap(bench: _Bench, repeats: int, live: int = 4, ctx: int = 512) -> dict:
    """FluidRole's memory remap: `resize_kv` shrinking to half the blocks (moving live KV) and back."""
    eng = bench.engine
    rids = [bench.request(ctx, ctx) for _ in range(live)]
    full = eng.blocks.num_blocks
    shrink, grow, moved = [], [], []
    for _ in range(repeats):
        r = eng.resize_kv(max(full // 2, eng.blocks.num_used + 1))
        shrink.append(r.seconds)
        moved.append(r.moved_blocks)
        grow.append(eng.resize_kv(full).seconds)
    bench.abort(rids)
    return {"shrink_s": median(shrink), "grow_s": median(grow), "moved_blocks": int(median(moved))}


def _contention_child(config, conn) -> None:  # in a spawned process
    import torch

    from fluidpd.engine.engine import LLMEngine
    from fluidpd.engine.plan import PrefillChunk, StepPlan

    torch.set_num_threads(1)
    bench = _Bench(LLMEngine(config), os.getpid())
    decodes = [bench.request(255, 255) for _ in range(4)]
    conn.send("ready")
    while (msg := conn.recv()) != "stop":
        kind, seconds = msg
        ts, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(ts) < 3:
            if kind == "decode":
                if bench.engine.blocks.num_free < len(decodes):  # contexts grew: start them again
                    bench.abort(decodes)
                    decodes = [bench.request(255, 255) for _ in range(4)]
                ts.append(bench.timed(StepPlan(decodes=list(decodes))))
            else:
                r = bench.request(256, 0)
                ts.append(bench.timed(StepPlan(prefills=[PrefillChunk(r, 256)])))
                bench.abort([r])
        conn.send(median(ts))


def measure_contention(engine_config, workers: int, seconds: float, advance, rounds: int = 2) -> dict:
    """Step time while k = 1..workers processes (one torch thread each) run steps at once, as
    slowdowns against k = 1: a decode step (4 x 256 tokens) and a 256-token prefill, among k - 1
    steps of the same kind ("decode", "prefill") and among k - 1 of the other ("decode_cross":
    a decode step while the others prefill; "prefill_cross"). Each level is timed right after
    the step alone (the host's speed drifts), over `rounds` rounds; the medians of the ratios."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    engine_config = _with_blocks(engine_config, 256)  # 4 x 256 decoding tokens, their growth, a prefill
    try:
        for _ in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_contention_child, args=(engine_config, child), daemon=True)
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        for pipe, proc in zip(pipes, procs):
            try:
                ready = pipe.poll(600) and pipe.recv() == "ready"
            except EOFError:
                ready = False
            if not ready:
                raise RuntimeError(f"contention worker (pid {proc.pid}) did not start: exit code {proc.exitcode}")

        def timed(kind: str, others: str, k: int) -> float:  # worker 0's median step, k - 1 others busy
            pipes[0].send((kind, seconds))
            for pipe in pipes[1:k]:
                pipe.send((others, seconds))
            return _answers(pipes[:k], kind)[0]

        # each level's time over worker 0 alone just before it (the host drifts), median of rounds
        ratios: dict[tuple, list[float]] = {}
        alone: dict[str, list[float]] = {"decode": [], "prefill": []}
        for _ in range(rounds):
            for kind, other in (("decode", "prefill"), ("prefill", "decode")):
                for k in range(2, workers + 1):
                    for label, others in (("same", kind), ("cross", other)):
                        base = timed(kind, kind, 1)
                        alone[kind].append(base)
                        ratios.setdefault((kind, label, k), []).append(timed(kind, others, k) / base)
                        advance()
        out: dict[str, list[float]] = {}
        for kind in ("decode", "prefill"):
            alone[kind] = alone[kind] or [timed(kind, kind, 1)]  # one worker: no levels
            out[kind] = [1.0] + [median(ratios[kind, "same", k]) for k in range(2, workers + 1)]
            out[f"{kind}_cross"] = [1.0] + [median(ratios[kind, "cross", k]) for k in range(2, workers + 1)]
            out[f"{kind}_s"] = [median(alone[kind]) * f for f in out[kind]]
        return out
    finally:
        for pipe in pipes:
            try:
                pipe.send("stop")
            except OSError:
                pass
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def _answers(pipes, kind: str) -> list[float]:
    try:
        return [pipe.recv() for pipe in pipes]
    except EOFError:
        raise RuntimeError(f"a contention worker died while timing {kind} steps") from None


PARTS = ("steps", "jitter", "kv_transfer", "fluidrole", "dispatch", "contention")


def measure_profile(
    engine_config, cfg: ProfileConfig, progress: bool = True, parts: tuple[str, ...] = PARTS, base: dict | None = None
) -> dict:
    """Everything `fluidpd profile` writes, measured on this host (see the module docstring); with
    `parts`, only those are measured and the rest is kept from `base` (a profile of this engine)."""
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"profile parts must be some of {', '.join(PARTS)}, got {', '.join(parts) or 'none'}")
    if set(parts) != set(PARTS) and base is None:
        raise ValueError("measuring only some parts needs the profile they update")
    out = dict(base or {})
    import torch
    from tqdm import tqdm

    from fluidpd.engine.engine import LLMEngine, load_model

    torch.set_num_threads(1)
    model, tok = load_model(engine_config)
    serving = LLMEngine(engine_config, model=model, tokenizer=tok)  # the KV a served worker gets
    need = -(-(cfg.max_decode_tokens + 2 * max(cfg.batches) + max(cfg.transfer_tokens)) // engine_config.block_size)
    big = replace(engine_config, num_kv_blocks=max(need, serving.blocks.num_blocks), arena_bytes=None)
    engine = LLMEngine(big, model=model, tokenizer=tok)
    other = LLMEngine(big, model=model, tokenizer=tok)
    bench = _Bench(engine, 0)
    spec = spec_of(model.config)
    facts = {
        "spec": None if spec is None else spec.name,
        "matmul_params": _matmul_params(model.config),
        "weight_bytes": model.weight_bytes(),
        "weight_format": model.quantization,
        "attention": model.attention,
        "kv_bytes_per_token": engine.arena.block_bytes // engine_config.block_size,
        "kv_blocks": serving.blocks.num_blocks,
        "block_size": engine_config.block_size,
        "max_model_len": engine.max_model_len,
    }
    n_points = len(cfg.priors) * len(cfg.chunks) + len(cfg.contexts) * len(cfg.batches)
    levels = 4 * (cfg.workers - 1) * cfg.contention_rounds if "contention" in parts else 0
    total = (n_points if "steps" in parts else 0) + levels + len(parts)
    with tqdm(total=total, desc="profile", disable=not progress) as bar:
        t0 = time.perf_counter()
        if "steps" in parts:
            out["steps"] = measure_steps(bench, cfg, bar.update)
        if "jitter" in parts:
            out["jitter"] = measure_jitter(bench, cfg.jitter_steps)
        if "kv_transfer" in parts:
            out["kv_transfer"] = measure_transfer(bench, other, cfg.transfer_tokens, cfg.transfer_repeats)
        if "fluidrole" in parts:
            out["fluidrole"] = measure_remap(bench, cfg.repeats)
        bar.update(len(set(parts) & {"steps", "jitter", "kv_transfer", "fluidrole"}))
        del engine, other, bench, model, serving  # the rest runs in spawned worker processes
        if "dispatch" in parts:
            out["dispatch"] = measure_dispatch(engine_config, cfg.dispatch_steps)
            bar.update()
        if "contention" in parts:
            out["contention"] = measure_contention(
                engine_config, cfg.workers, cfg.contention_s, bar.update, cfg.contention_rounds
            )
            bar.update()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return out | {
        "version": PROFILE_VERSION,
        "date": stamp,
        "host": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "mem_bytes": _mem_bytes(),
            "platform": platform.platform(),
        },
        "engine": asdict(engine_config),
        "model": facts,
        "config": asdict(cfg),
        "measure_s": time.perf_counter() - t0,
        "measured_parts": (base or {}).get("measured_parts", {}) | dict.fromkeys(parts, stamp),
    }


def spec_of(mc):
    """The catalogue ModelSpec (fluidpd.specs.models) with this engine model's shape, or None."""
    from fluidpd.specs.models import MODELS

    key = (mc.num_layers, mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.intermediate_size, mc.vocab_size)
    for name in MODELS:
        m = MODELS.get(name)
        if (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.intermediate, m.vocab) == key:
            return m
    return None


def _matmul_params(mc) -> int:
    """Weights multiplied per token (projections of every layer and the LM head)."""
    d = mc.head_dim
    attn = mc.hidden_size * (mc.num_heads + 2 * mc.num_kv_heads) * d + mc.num_heads * d * mc.hidden_size
    return mc.num_layers * (attn + 3 * mc.hidden_size * mc.intermediate_size) + mc.vocab_size * mc.hidden_size


def _mem_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
