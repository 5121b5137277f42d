"""Batch-1 decode step vs the weight-streaming limit on this machine (one torch thread).

A batch-1 decode step must read every weight once, so it cannot beat
    weight bytes / memory bandwidth.
The script measures this machine's single-thread read bandwidth (median of repeats) two ways on
a 1 GiB buffer, well beyond the caches: a plain reduction (`sum`) and a matrix-vector product
(the decode step's own access pattern); the faster one sets the limit.

    python benchmarks/engine_bandwidth.py [--repeats 7] [--steps 32]
"""

from __future__ import annotations

import argparse
import time

import torch
from engine_common import engine, engine_decode_steps, median, progress, random_prompts


def read_bandwidth(repeats: int, gib: float = 1.0) -> dict[str, float]:
    n = int(gib * (1 << 30)) // 4
    buf = torch.empty(n, dtype=torch.float32).normal_()
    mat = buf.view(-1, 4096)
    vec = torch.randn(4096)
    out = {}
    for name, fn in (("sum", lambda: buf.sum()), ("gemv", lambda: torch.mv(mat, vec))):
        fn()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out[name] = n * 4 / median(ts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per repeat")
    ap.add_argument("--ctx", type=int, default=256)
    args = ap.parse_args()

    eng = engine(64)
    wbytes = eng.model.weight_bytes()
    steps, bws = [], {"sum": [], "gemv": []}
    for r in progress(range(args.repeats), "repeats"):  # alternate: bandwidth, then decode
        for k, v in read_bandwidth(3).items():
            bws[k].append(v)
        steps += engine_decode_steps(eng, random_prompts([args.ctx], seed=r), args.steps)
    bw = {k: median(v) for k, v in bws.items()}
    best = max(bw.values())
    limit = wbytes / best
    step = median(steps)
    print(
        f"weights streamed per decode step: {wbytes / 1e6:.1f} MB ({eng.model.dtype}, "
        f"{eng.model_config.num_layers} layers, lm_head {tuple(eng.model.lm_head.shape)})"
    )
    print(
        f"single-thread read bandwidth: sum {bw['sum'] / 1e9:.2f} GB/s, gemv {bw['gemv'] / 1e9:.2f} GB/s "
        f"(limit uses {best / 1e9:.2f} GB/s)"
    )
    print(
        f"weight-streaming limit {limit * 1e3:.1f} ms/step; batch-1 decode step (ctx {args.ctx}) "
        f"{step * 1e3:.1f} ms median of {len(steps)}; {1 / step:.1f} tok/s"
    )
    print(
        f"engine_bandwidth: batch-1 decode step = {step / limit:.2f}x the weight-streaming limit "
        f"({step * 1e3:.1f} ms vs {limit * 1e3:.1f} ms; target <= 2.0x)"
    )


if __name__ == "__main__":
    main()
