"""Decode attention over paged KV read in place (the C kernel, `--attention paged`) vs page gathers +
SDPA (`--attention gather`): whole decode steps at batch 1, 8 and 32 (context lengths 64..1024, as
engine_step_split.py), both models in one process, rounds interleaved, medians; plus one layer's
attention alone on the same pages. Also checks the two paths' greedy outputs and logprobs agree;
writes results/engine_paged_attention.png.

    .venv/bin/python benchmarks/engine/engine_paged_attention.py [--rounds 5] [--steps 6] [--quantization fp16]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
from engine_common import median, progress, random_prompts

from fluidpd.engine.config import QUANTIZATIONS, EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.plan import StepPlan
from fluidpd.engine.sampling import SamplingParams

PATHS = ("paged", "gather")


def decode_rids(eng: LLMEngine, lens: list[int]) -> list[str]:
    params = SamplingParams(max_tokens=4096, ignore_eos=True)
    rids = [eng.add_request(p, params) for p in random_prompts(lens, 0)]
    while any(not eng.request(r).is_decoding for r in rids):
        eng.step()
    return rids


def step_times(eng: LLMEngine, rids: list[str], steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.run_step(StepPlan(decodes=list(rids)))
        out.append(time.perf_counter() - t)
    return out


def attention_op_seconds(eng: LLMEngine, rids: list[str], repeats: int = 20) -> float:
    """One layer's decode attention (K/V write included) over the batch's pages, as the forward runs it."""
    seqs = [eng.seqs[r] for r in rids]
    eng._reserve([(s, 1) for s in seqs])  # the next token's slot, as a step reserves it
    _, _, meta, _, _ = eng.runner.prepare([(s, 1) for s in seqs])
    mc, layer = eng.model_config, eng.model.layers[0]
    n = len(seqs)
    q = torch.randn(n, mc.num_heads + mc.num_kv_heads, mc.head_dim)
    k = v = torch.randn(n, mc.num_kv_heads, mc.head_dim)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        layer.attention(q[:, : mc.num_heads], k, v, meta, eng.arena, 0)
        times.append(time.perf_counter() - t)
    return median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6, help="decode steps timed per round")
    ap.add_argument("--quantization", default="fp16", choices=QUANTIZATIONS)
    ap.add_argument("--plot", default="results/engine_paged_attention.png")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(1)
    cases = {"b1": [256], "b8": [rng.randint(64, 1024) for _ in range(8)]}
    cases["b32"] = [rng.randint(64, 1024) for _ in range(32)]
    blocks = sum(-(-(n + args.rounds * args.steps + 64) // 16) for n in cases["b32"]) + 64
    engines = {}
    for path in PATHS:
        config = EngineConfig(
            num_kv_blocks=blocks,
            quantization=args.quantization,
            attention=path,
            max_num_batched_tokens=sum(cases["b32"]),
        )
        model, tok = load_model(config)
        engines[path] = LLMEngine(config, model=model, tokenizer=tok)

    # the two paths on the same requests: greedy tokens and their logprobs agree
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0)
    outs = {p: e.generate(random_prompts(cases["b8"], 2), params) for p, e in engines.items()}
    same = sum(a.token_ids == b.token_ids for a, b in zip(outs["paged"], outs["gather"]))
    drift = max(
        abs(x.logprob - y.logprob)
        for a, b in zip(outs["paged"], outs["gather"])
        for x, y in zip(a.logprobs or [], b.logprobs or [])
    )

    step = {(c, p): [] for c in cases for p in PATHS}
    op = {}
    for case, lens in progress(cases.items(), "batch sizes"):
        rids = {p: decode_rids(e, lens) for p, e in engines.items()}
        for p, e in engines.items():
            step_times(e, rids[p], 1)  # warm
            op[case, p] = attention_op_seconds(e, rids[p])
        for _ in range(args.rounds):
            for p, e in engines.items():
                step[case, p].append(median(step_times(e, rids[p], args.steps)))
        for p, e in engines.items():
            for r in rids[p]:
                e.abort(r)

    print(
        f"weights {args.quantization}; paged vs gather: {same}/{len(outs['paged'])} greedy outputs equal, "
        f"max |dlogprob| {drift:.1e}"
    )
    print(f"{'batch':6} {'step paged':>11} {'step gather':>12} {'speed-up':>9} {'attn paged':>11} {'attn gather':>12}")
    ratio = {}
    for case in cases:
        sp, sg = median(step[case, "paged"]), median(step[case, "gather"])
        ratio[case] = median(g / p for p, g in zip(step[case, "paged"], step[case, "gather"]))
        print(
            f"{case:6} {sp * 1e3:9.1f}ms {sg * 1e3:10.1f}ms {ratio[case]:8.2f}x "
            f"{op[case, 'paged'] * 1e6:9.0f}us {op[case, 'gather'] * 1e6:10.0f}us"
        )
    plot(step, cases, args)
    sp, sg = median(step["b32", "paged"]), median(step["b32", "gather"])
    print(
        f"engine_paged_attention: batch-32 decode step paged {sp * 1e3:.0f} ms vs gather {sg * 1e3:.0f} ms "
        f"({ratio['b32']:.2f}x), batch-8 {ratio['b8']:.2f}x, batch-1 {ratio['b1']:.2f}x; "
        f"one layer's attention at batch 32 {op['b32', 'gather'] / op['b32', 'paged']:.1f}x faster"
    )


def plot(step: dict, cases: dict, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(cases))
    for i, p in enumerate(PATHS):
        ax.bar([x + 0.4 * i for x in xs], [median(step[c, p]) * 1e3 for c in cases], 0.4, label=p)
    ax.set_xticks([x + 0.2 for x in xs], list(cases))
    ax.set_ylabel("decode step (ms)")
    ax.set_title(f"Decode step, paged kernel vs page gathers ({args.quantization} weights)")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
