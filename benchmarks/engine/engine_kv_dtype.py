"""Decode steps over a float16 KV arena vs a float32 one (`kv_cache_dtype`), same weights, same run.

Two SmolLM2 engines share one model (weight format `--quantization`, default auto: the GGUF's blocks)
and differ only in their KV dtype; rounds alternate between them (the machine may be shared: compare
the ratio, not the times). Cases: batch 1 at a short and a long context, batch 8. Prints each case's
median step, the float16 / float32 ratio, and the arenas' sizes.

    python benchmarks/engine/engine_kv_dtype.py [--rounds 5] [--steps 16] [--quantization auto]
"""

from __future__ import annotations

import argparse

import torch
from engine_common import engine, engine_decode_steps, median, progress, random_prompts

CASES = {"b1 ctx 256": [256], "b1 ctx 2048": [2048], "b8 ctx 512": [512] * 8}
DTYPES = ("float32", "float16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per case and round")
    ap.add_argument("--quantization", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(1)

    blocks = max(sum(-(-(n + args.steps + 8) // 16) for n in lens) for lens in CASES.values()) + 16
    engines = {kv: engine(blocks, args.quantization, kv_cache_dtype=kv, max_num_batched_tokens=4096) for kv in DTYPES}
    times: dict[tuple[str, str], list[float]] = {(kv, c): [] for kv in DTYPES for c in CASES}
    for r in progress(range(args.rounds), "rounds"):
        order = DTYPES if r % 2 == 0 else DTYPES[::-1]
        for case, lens in CASES.items():
            prompts = random_prompts(lens, seed=r)
            for kv in order:
                times[kv, case] += engine_decode_steps(engines[kv], prompts, args.steps)
    for kv, eng in engines.items():
        s = eng.stats()
        print(
            f"{kv:8} KV: block {s.block_bytes / 1024:.0f} KiB, {s.num_kv_blocks} blocks = {s.kv_bytes / 2**20:.1f} MiB "
            f"(+ scratch {s.scratch_bytes / 2**20:.0f} MiB); weights {eng.model.quantization}"
        )
    parts = []
    for case in CASES:
        t32, t16 = median(times["float32", case]), median(times["float16", case])
        n = len(times["float16", case])
        print(
            f"{case:12}: float32 KV {t32 * 1e3:6.2f} ms, float16 KV {t16 * 1e3:6.2f} ms "
            f"(medians of {n}) = {t16 / t32:.3f}x"
        )
        parts.append(f"{case} {t16 / t32:.3f}x")
    print("engine_kv_dtype (decode step, float16 / float32 KV): " + ", ".join(parts))


if __name__ == "__main__":
    main()
