"""Batch-1 decode step vs the weight-streaming limit of the weights as stored, per weight format (one torch thread).

A batch-1 decode step must read every weight once, so it cannot beat
    weight bytes (as stored: fp32, fp16 or int8) / memory bandwidth.
The script measures this machine's single-thread read bandwidth (median of repeats) two ways on
a 1 GiB buffer, well beyond the caches: a plain reduction (`sum`) and a matrix-vector product
(the decode step's own access pattern); the faster one sets the limit. Formats and bandwidth
are measured in alternation, in the same run.

    python benchmarks/engine_bandwidth.py [--repeats 7] [--steps 32] [--formats none,fp16,int8]
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
    ap.add_argument("--formats", default="none,fp16,int8", help="weight formats (--quantization), comma-separated")
    args = ap.parse_args()

    formats = args.formats.split(",")
    engines = {q: engine(64, quantization=q) for q in formats}
    steps: dict[str, list[float]] = {q: [] for q in formats}
    bws: dict[str, list[float]] = {"sum": [], "gemv": []}
    for r in progress(range(args.repeats), "repeats"):  # alternate: bandwidth, then each format
        for k, v in read_bandwidth(3).items():
            bws[k].append(v)
        for q, eng in engines.items():
            steps[q] += engine_decode_steps(eng, random_prompts([args.ctx], seed=r), args.steps)
    bw = {k: median(v) for k, v in bws.items()}
    best = max(bw.values())
    cfg = next(iter(engines.values())).model_config
    print(
        f"single-thread read bandwidth: sum {bw['sum'] / 1e9:.2f} GB/s, gemv {bw['gemv'] / 1e9:.2f} GB/s "
        f"(limit uses {best / 1e9:.2f} GB/s); {cfg.num_layers} layers, lm_head {cfg.vocab_size}x{cfg.hidden_size}"
    )
    ratios = {}
    for q, eng in engines.items():
        wbytes = eng.model.weight_bytes()
        limit, step = wbytes / best, median(steps[q])
        ratios[q] = (step / limit, step, limit)
        print(
            f"{q:5} weights {wbytes / 1e6:6.1f} MB: limit {limit * 1e3:5.1f} ms/step, batch-1 step (ctx {args.ctx}) "
            f"{step * 1e3:5.1f} ms median of {len(steps[q])} = {step / limit:.2f}x the limit, {1 / step:.1f} tok/s"
        )
    print(
        "engine_bandwidth: batch-1 decode step / weight-streaming limit: "
        + ", ".join(f"{q} {r:.2f}x ({s * 1e3:.1f} vs {lim * 1e3:.1f} ms)" for q, (r, s, lim) in ratios.items())
        + " (target <= 1.3x)"
    )


if __name__ == "__main__":
    main()
