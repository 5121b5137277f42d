"""torch.compile (inductor, C++ on the CPU) on a layer's small ops: compile time and per-call time against eager.

One op group per compiled function (dynamic=False).

SmolLM2's shapes, one torch thread, batch 1 and 8; the fused C kernels (benchmarks/engine/engine_layer_ops.py)
are the alternative. Medians of 300 calls.

    .venv/bin/python benchmarks/engine/engine_layer_ops_compile.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
H, KV, D, HID, INTER = 9, 3, 64, 576, 1536


def glue_pre(x, r, w, eps: float):
    x.add_(r)
    return F.rms_norm(x, (HID,), w, eps)


def rope_kv(qkv, cos, sin, kc, vc, blk, off):
    n = qkv.shape[0]
    qk = qkv[:, : (H + KV) * D].view(n, H + KV, D)
    x1, x2 = qk[..., : D // 2], qk[..., D // 2 :]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    kc.index_put_((blk, off), out[:, H:])
    vc.index_put_((blk, off), qkv[:, (H + KV) * D :].view(n, KV, D))
    return out


def silu_mul(gu):
    return F.silu(gu[:, :INTER]) * gu[:, INTER:]


def med(f, n=300):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def main() -> None:
    rows = []
    for n in (1, 8):
        x, r, w = torch.randn(n, HID), torch.randn(n, HID), torch.randn(HID)
        qkv = torch.randn(n, (H + 2 * KV) * D)
        cos, sin = torch.randn(n, 1, D // 2), torch.randn(n, 1, D // 2)
        kc, vc = torch.zeros(100, 16, KV, D), torch.zeros(100, 16, KV, D)
        blk, off = torch.randint(0, 100, (n,)), torch.randint(0, 16, (n,))
        gu = torch.randn(n, 2 * INTER)
        cases = {
            "add+rmsnorm": (glue_pre, (x, r, w, 1e-5)),
            "rope+kv": (rope_kv, (qkv, cos, sin, kc, vc, blk, off)),
            "silu*up": (silu_mul, (gu,)),
        }
        with torch.inference_mode():
            for name, (f, args) in cases.items():
                eager = med(lambda f=f, args=args: f(*args))
                t = time.perf_counter()
                cf = torch.compile(f, dynamic=False)
                cf(*args)
                compile_s = time.perf_counter() - t
                comp = med(lambda cf=cf, args=args: cf(*args))
                rows.append((n, name, eager, comp, compile_s))
                print(
                    f"n={n} {name}: eager {eager:.1f} us, compiled {comp:.1f} us, compile {compile_s:.1f} s", flush=True
                )
    eager, comp = sum(r[2] for r in rows if r[0] == 1), sum(r[3] for r in rows if r[0] == 1)
    print(
        f"engine_layer_ops_compile: batch 1, one layer's small ops: eager {eager:.0f} us, torch.compile {comp:.0f} us "
        f"({comp / eager:.2f}x); compile {sum(r[4] for r in rows):.0f} s in all ({rows[0][4]:.0f} s for the first)"
    )


if __name__ == "__main__":
    main()
