"""The gguf linear kernel per SmolLM2 layer shape: from-blocks kernel (AVX2, AVX-512) vs dequantise + torch.mm vs fp16.

For each of SmolLM2's linear shapes (Q4_1 q|k|v, o, gate|up, down; the Q8_0 lm_head) and each
number of activation rows N, the median time of one call of: the kernel on its AVX2 and AVX-512
paths (bit-identical results), the dequantise + torch.mm path, the `gguf-q8` kernel (int8
activations), and fbgemm's fp16 layer (the previous default). Calls alternate in the same run;
one torch thread unless `--threads`. The headline gives, per shape, the smallest N from which
dequantise + torch.mm is faster than the kernel (what `MM_FROM_ROWS` in
fluidpd/engine/gguf_linear.py is set from), the kernel's time over fp16's at N = 1 and 8, and
gguf-q8's over the kernel's at N = 1.

    python benchmarks/engine/engine_gguf_linear.py [--reps 50] [--rows 1,8,16,24,32,48,64] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
from engine_common import median
from gguf import GGMLQuantizationType
from gguf.quants import quantize

import fluidpd.engine.gguf_linear as gl
from fluidpd.engine.linear import Fp16Linear
from fluidpd.engine.quantized import QuantizedTensor

SHAPES = {"qkv": ("Q4_1", 960, 576), "o": ("Q4_1", 576, 576), "gate_up": ("Q4_1", 3072, 576)}
SHAPES |= {"down": ("Q4_1", 576, 1536), "lm_head": ("Q8_0", 49152, 576)}


def timed(fns: dict, reps: int) -> dict[str, float]:
    ts: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t)
    return {k: median(v) for k, v in ts.items()}


def call(lin, x: torch.Tensor, isa: int | None = None, mm_from: int = 0):
    """lin(x) on kernel path `isa` with dequantise + torch.mm from `mm_from` rows (None: not a gguf layer)."""

    def f():
        if isa is not None:
            gl.kernel().set_isa(isa)
            if lin.mm_from_rows is not None:
                lin.mm_from_rows = mm_from
        lin(x)

    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rows", default="1,8,16,24,32,48,64")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k, mm_from = gl.kernel(), gl.MM_FROM_ROWS
    widest = len(gl.ISAS) - 1
    torch.manual_seed(0)
    cross, vs_fp16, q8_vs = {}, {}, {}
    cols = ("avx2 us", "avx512 us", "mm us", "q8 us", "fp16 us")
    print(f"{'shape':8} {'N':>3} " + " ".join(f"{c:>9}" for c in cols) + "  kernel/fp16")
    for name, (kind, rows, cols) in SHAPES.items():
        w = torch.randn(rows, cols) * 0.05
        qt = QuantizedTensor(
            kind, (rows, cols), torch.from_numpy(quantize(w.numpy(), GGMLQuantizationType[kind]).copy())
        )
        lin, q8, f16 = gl.GgufLinear(qt), gl.GgufLinear(qt, act8=True), Fp16Linear(qt.dequantize())

        for n in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(n, cols)
            fns = {
                "avx2": call(lin, x, isa=1, mm_from=1 << 30),
                "avx512": call(lin, x, isa=widest, mm_from=1 << 30),
                "mm": call(lin, x, isa=widest, mm_from=0),
                "q8": call(q8, x, isa=widest),
                "fp16": call(f16, x),
            }
            t = timed(fns, max(5, args.reps // 10) if name == "lm_head" else args.reps)
            best = min(t["avx2"], t["avx512"])
            if t["mm"] < best and name not in cross:
                cross[name] = n
            vs_fp16[name, n] = best / t["fp16"]
            if n == 1:
                q8_vs[name] = t["q8"] / best
            print(
                f"{name:8} {n:3} {t['avx2'] * 1e6:9.1f} {t['avx512'] * 1e6:10.1f} {t['mm'] * 1e6:9.1f} "
                f"{t['q8'] * 1e6:9.1f} {t['fp16'] * 1e6:9.1f}  {best / t['fp16']:.2f}"
            )
    k.set_isa(widest)
    print(
        f"engine_gguf_linear ({args.threads} thread(s)): dequantise + torch.mm beats the kernel from N = "
        + ", ".join(f"{s} {cross.get(s, '>max')}" for s in SHAPES)
        + f" (MM_FROM_ROWS = {mm_from}); kernel / fp16 at N=1: "
        + ", ".join(f"{s} {vs_fp16.get((s, 1), float('nan')):.2f}" for s in SHAPES)
        + ", N=8: "
        + ", ".join(f"{s} {vs_fp16.get((s, 8), float('nan')):.2f}" for s in SHAPES)
        + "; gguf-q8 / kernel at N=1: "
        + ", ".join(f"{s} {q8_vs.get(s, float('nan')):.2f}" for s in SHAPES)
    )


if __name__ == "__main__":
    main()
