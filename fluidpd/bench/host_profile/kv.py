"""KV movement: hand-off between two engines over shared memory, and FluidRole's in-place remap."""

from __future__ import annotations

import time
from statistics import median

from fluidpd.bench.host_profile.step_bench import StepBench


def measure_transfer(bench: StepBench, other, tokens: tuple[int, ...], repeats: int) -> dict:
    """KV hand-off of requests of `tokens` tokens between two engines: export, the shared-memory
    transport's send and receive, import; fitted as latency + bytes / bandwidth (least relative
    error: each size counts alike), with the share of the time spent on the source side (export
    and send: the rest is the destination's)."""
    import numpy as np

    from fluidpd.runtime.transport import get_transport

    shm = get_transport("shm")
    kv_tokens = bench.engine.blocks.num_blocks * bench.engine.config.block_size
    per_token = bench.engine.arena.block_bytes // bench.engine.config.block_size
    room = _shm_free_bytes() // 2  # a container's /dev/shm may be 64 MB: a segment past it is a SIGBUS
    points = []
    for n in (n for n in tokens if n + 16 < min(kv_tokens, bench.engine.max_model_len) and n * per_token <= room):
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
        raise ValueError(
            f"KV transfer needs two request sizes that fit the engine's KV and /dev/shm ({room * 2} B free)"
        )
    seconds = np.array([p["seconds"] for p in points])
    slope, intercept = np.polyfit([p["bytes"] for p in points], seconds, 1, w=1 / seconds)  # relative error
    share = sum(p["export_s"] for p in points) / sum(p["seconds"] for p in points)
    return {
        "points": points,
        "bandwidth_Bps": 1.0 / max(slope, 1e-15),
        "latency_s": max(0.0, float(intercept)),
        "export_share": share,
    }


def measure_remap(bench: StepBench, repeats: int, live: int = 4, ctx: int = 512) -> dict:
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


def _shm_free_bytes() -> int:
    """Bytes free in the shared-memory file system the transport's segments live in (unbounded where there is none)."""
    import os

    from fluidpd.runtime.transport.shm_segment import SHM_DIR

    if not os.path.isdir(SHM_DIR):
        return 1 << 62
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize
