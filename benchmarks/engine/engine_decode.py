"""Decode throughput at batch 1, 8 and 32 (mixed context lengths) and prefill tokens/s at 512 tokens,
FluidPD's engine vs transformers `generate` on the same model (SmolLM2-135M GGUF, fp32), same run,
one torch thread. Medians over repeated rounds, alternating engine and transformers.

    python benchmarks/engine/engine_decode.py [--rounds 3] [--steps 8]
"""

from __future__ import annotations

import argparse
import random

from engine_common import (
    engine,
    engine_decode_steps,
    engine_prefill_seconds,
    hf_generate_times,
    hf_model,
    median,
    peak_rss_mib,
    progress,
    random_prompts,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per round")
    ap.add_argument("--min-ctx", type=int, default=64)
    ap.add_argument("--max-ctx", type=int, default=1024)
    args = ap.parse_args()

    rng = random.Random(1)
    cases = {"b1": [256]}
    for b in (8, 32):
        cases[f"b{b}"] = [rng.randint(args.min_ctx, args.max_ctx) for _ in range(b)]
    blocks = sum(-(-(n + args.steps + 8) // 16) for n in cases["b32"]) + 64
    eng = engine(blocks, max_num_batched_tokens=sum(cases["b32"]))
    hf = hf_model()
    ours = {k: [] for k in cases}
    theirs = {k: [] for k in cases}
    pre_ours, pre_hf = [], []
    prefill_prompt = random_prompts([512], seed=99)[0]
    for r in progress(range(args.rounds), "rounds"):
        for name, lens in cases.items():
            prompts = random_prompts(lens, seed=r)
            ours[name] += engine_decode_steps(eng, prompts, args.steps)
            theirs[name] += hf_generate_times(hf, prompts, args.steps + 1)[1]
        pre_ours.append(engine_prefill_seconds(eng, prefill_prompt))
        pre_hf.append(hf_generate_times(hf, [prefill_prompt], 1)[0])

    print(
        f"{'case':6} {'contexts':>14} {'engine tok/s':>13} {'hf tok/s':>10} {'ratio':>7}   "
        "(median step ms: engine / hf)"
    )
    ratios = {}
    for name, lens in cases.items():
        b = len(lens)
        e, h = median(ours[name]), median(theirs[name])
        ratios[name] = h / e
        ctx = f"{min(lens)}-{max(lens)}" if b > 1 else str(lens[0])
        print(f"{name:6} {ctx:>14} {b / e:13.1f} {b / h:10.1f} {h / e:6.2f}x   ({e * 1e3:.1f} / {h * 1e3:.1f})")
    pe, ph = median(pre_ours), median(pre_hf)
    ratios["prefill512"] = ph / pe
    print(
        f"{'prefill':6} {512:>14} {512 / pe:13.1f} {512 / ph:10.1f} {ph / pe:6.2f}x   ({pe * 1e3:.1f} / {ph * 1e3:.1f})"
    )
    print(
        f"peak RSS (engine + transformers in one process): {peak_rss_mib():.0f} MiB; "
        f"{args.rounds} rounds x {args.steps} decode steps per case"
    )
    print(
        "engine_decode: decode vs transformers generate "
        f"b1 {ratios['b1']:.2f}x (target >= 1.0), b8 {ratios['b8']:.2f}x, "
        f"b32 {ratios['b32']:.2f}x (target >= 2.0); prefill@512 {ratios['prefill512']:.2f}x"
    )


if __name__ == "__main__":
    main()
