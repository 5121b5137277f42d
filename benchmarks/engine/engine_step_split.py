"""Where a decode step's time goes: GEMM, attention, KV page copies, other ops, and Python around them.

SmolLM2 (GGUF, fp32 and no quantization by default), one torch thread, pure decode steps at batch 1, 8 and 32 (mixed
context lengths 64..1024, as engine_decode.py), under torch.profiler. Each op's self CPU time is
put in one bucket: GEMM (mm, addmm: the linear layers and the LM head), attention (SDPA and the
kernels under it), KV copies (index_select gathering pages into a contiguous copy, index_put_
writing new K/V, copies), other ops (norms, RoPE, activations, sampling); what is left of the wall
time is Python and dispatch. Medians of the per-step shares over `--steps` profiled steps.
`--layer-ops torch` profiles the reference path of the small ops; with `fused` (the default where
it builds) their C kernels are ctypes calls, invisible to the profiler: they count as Python.
benchmarks/engine/engine_layer_ops.py times the two paths against each other.

    .venv/bin/python benchmarks/engine/engine_step_split.py [--steps 6] [--dtype float32|bfloat16]
        [--quantization int8|fp16] [--layer-ops auto|fused|torch]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from engine_common import median, random_prompts
from torch.profiler import ProfilerActivity, profile

from fluidpd.engine.config import LAYER_OPS, QUANTIZATIONS, EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.plan import StepPlan
from fluidpd.engine.sampling import SamplingParams

BUCKETS = {
    "GEMM": ("aten::mm", "aten::addmm", "quantized::linear"),
    "attention": (
        "fluidpd::paged_decode_attention",
        "scaled_dot_product",
        "flash_attention",
        "aten::bmm",
        "aten::baddbmm",
        "softmax",
        "aten::_efficient",
    ),
    "KV copies": ("aten::index_select", "aten::index_put", "aten::copy_", "aten::cat", "aten::clone", "aten::gather"),
}


def bucket(name: str) -> str:
    return next((b for b, keys in BUCKETS.items() if any(k in name for k in keys)), "other ops")


def split_of_step(eng: LLMEngine, rids: list[str], top: int = 0) -> dict[str, float]:
    plan = StepPlan(decodes=list(rids))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        eng.run_step(plan)
        wall = time.perf_counter() - t0
    if top:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    out = dict.fromkeys([*BUCKETS, "other ops"], 0.0)
    for ev in prof.key_averages():
        out[bucket(ev.key)] += ev.self_cpu_time_total / 1e6
    out["Python"] = max(0.0, wall - sum(out.values()))
    out["wall"] = wall
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    ap.add_argument("--layer-ops", default="auto", choices=("auto", *LAYER_OPS))
    ap.add_argument("--top", type=int, default=0, help="also print the N ops with the most self time (batch 32)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(1)
    cases = {"b1": [256], "b8": [rng.randint(64, 1024) for _ in range(8)]}
    cases["b32"] = [rng.randint(64, 1024) for _ in range(32)]
    blocks = sum(-(-(n + args.steps + 16) // 16) for n in cases["b32"]) + 64
    config = EngineConfig(
        num_kv_blocks=blocks,
        dtype=args.dtype,
        quantization=args.quantization,
        max_num_batched_tokens=sum(cases["b32"]),
        layer_ops=args.layer_ops,
    )
    model, tok = load_model(config)
    eng = LLMEngine(config, model=model, tokenizer=tok)
    names = [*BUCKETS, "other ops", "Python"]
    print(f"{'batch':6} {'step ms':>8} " + " ".join(f"{n:>10}" for n in names))
    rows = {}
    for case, lens in cases.items():
        params = SamplingParams(max_tokens=4096, ignore_eos=True)
        rids = [eng.add_request(p, params) for p in random_prompts(lens, 0)]
        while any(not eng.request(r).is_decoding for r in rids):
            eng.step()
        eng.run_step(StepPlan(decodes=list(rids)))  # warm
        steps = [split_of_step(eng, rids, args.top if i == 0 and case != "b8" else 0) for i in range(args.steps)]
        for r in rids:
            eng.abort(r)
        wall = median(s["wall"] for s in steps)
        shares = {n: median(s[n] / s["wall"] for s in steps) for n in names}
        rows[case] = (wall, shares)
        print(f"{case:6} {wall * 1e3:8.1f} " + " ".join(f"{shares[n]:10.0%}" for n in names))
    wall, shares = rows["b32"]
    print(
        f"engine_step_split ({args.dtype}, quantization {args.quantization}, layer ops {model.layer_ops}): "
        f"batch-32 decode step {wall * 1e3:.0f} ms: " + ", ".join(f"{n} {shares[n]:.0%}" for n in names)
    )


if __name__ == "__main__":
    main()
