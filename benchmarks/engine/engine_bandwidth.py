"""Batch-1 and batch-8 decode steps vs the weight-streaming limit of the weights as stored, per weight format.

A decode step must read every weight once, so it cannot beat
    weight bytes (as stored: fp32, fp16, int8 or the GGUF's blocks) / memory bandwidth.
The script measures this machine's single-thread read bandwidth (median of repeats) two ways on
a 1 GiB buffer, well beyond the caches: a plain reduction (`sum`) and a matrix-vector product
(the decode step's own access pattern); the faster one sets the limit. Formats and bandwidth
are measured in alternation, in the same run, at one torch thread (`--threads` for more; the
limit stays the single-thread bandwidth). The headline compares the new default (`gguf`) with
`fp16`, the previous default: its step time over the limit and over fp16's step, at batch 1 and 8.

    python benchmarks/engine/engine_bandwidth.py [--repeats 7] [--steps 32] [--formats none,fp16,int8,gguf]
        [--batches 1,8]
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
    ap.add_argument("--formats", default="none,fp16,int8,gguf", help="weight formats (--quantization), comma-separated")
    ap.add_argument("--batches", default="1,8", help="decode batch sizes, comma-separated")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the decode steps")
    args = ap.parse_args()

    formats = args.formats.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    engines = {q: engine(16 * max(batches) * (args.ctx // 16 + 4), quantization=q) for q in formats}
    steps: dict[tuple[str, int], list[float]] = {(q, b): [] for q in formats for b in batches}
    bws: dict[str, list[float]] = {"sum": [], "gemv": []}
    for r in progress(range(args.repeats), "repeats"):  # alternate: bandwidth, then each format
        torch.set_num_threads(1)
        for k, v in read_bandwidth(3).items():
            bws[k].append(v)
        torch.set_num_threads(args.threads)
        for q, eng in engines.items():
            for b in batches:
                steps[q, b] += engine_decode_steps(eng, random_prompts([args.ctx] * b, seed=r), args.steps)
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
        limit = wbytes / best
        for b in batches:
            step = median(steps[q, b])
            ratios[q, b] = (step / limit, step, limit)
            print(
                f"{q:5} weights {wbytes / 1e6:6.1f} MB: limit {limit * 1e3:5.1f} ms/step, "
                f"batch-{b} step (ctx {args.ctx}) {step * 1e3:5.1f} ms median of {len(steps[q, b])} "
                f"= {step / limit:.2f}x the limit, {b / step:.1f} tok/s"
            )
    plot(ratios, formats, batches)
    head = "gguf" if "gguf" in formats else formats[-1]
    vs = (
        ", ".join(
            f"b{b} {ratios[head, b][0]:.2f}x ({ratios[head, b][1] * 1e3:.1f} vs {ratios[head, b][2] * 1e3:.1f} ms; "
            f"{ratios['fp16', b][1] / ratios[head, b][1]:.2f}x faster than fp16)"
            for b in batches
        )
        if "fp16" in formats
        else ""
    )
    print(
        f"engine_bandwidth ({args.threads} thread(s)): decode step / weight-streaming limit: "
        + ", ".join(f"{q}@b{b} {r:.2f}x" for (q, b), (r, _, _) in ratios.items())
        + f"; {head}: {vs} (target <= 1.3x at b1)"
    )


def plot(ratios: dict, formats: list[str], batches: list[int]) -> None:
    """benchmarks/engine/engine_bandwidth.png: step time over the limit per format and batch size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(batches)
    for i, b in enumerate(batches):
        ax.bar(
            [j + i * width for j in range(len(formats))], [ratios[q, b][0] for q in formats], width, label=f"batch {b}"
        )
    ax.axhline(1.3, color="k", ls="--", lw=1, label="target 1.3x")
    ax.set_xticks([j + width * (len(batches) - 1) / 2 for j in range(len(formats))], formats)
    ax.set_ylabel("decode step / weight-streaming limit")
    ax.legend()
    fig.tight_layout()
    fig.savefig(__file__.replace(".py", ".png"), dpi=100)


if __name__ == "__main__":
    main()
