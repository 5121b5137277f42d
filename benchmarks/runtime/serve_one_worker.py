"""`fluidpd serve --workers 1` speed: one worker through the World and the policy vs the bare engine.

One worker used to be served by the engine's own scheduler on a thread (LocalRuntime); now it
runs through the same World lifecycle and policy as every cluster. This measures what that costs:
output tokens/s of the coordinator with one colocated worker (in-process and process backends)
against the bare engine driven by its own scheduler (`engine.generate`, what the old path ran),
in interleaved rounds in one run, on a closed loop of 8 requests (128-token prompts, 32 output
tokens) and on one stream (128 in, 64 out). Ratios of medians; > 1 means faster than the engine.

    .venv/bin/python benchmarks/runtime/serve_one_worker.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import CONFIG, coordinator, prompt, timed

from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.sampling import SamplingParams

LOADS = {"8 streams": (8, 128, 32), "1 stream": (1, 128, 64)}


def engine_tok_s(engine: LLMEngine, n: int, prompt_len: int, out: int, seed: int) -> float:
    ids = [prompt(prompt_len, seed + i) for i in range(n)]
    t0 = time.perf_counter()
    outs = engine.generate(ids, SamplingParams(max_tokens=out, ignore_eos=True))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


async def runtime_tok_s(coord, n: int, prompt_len: int, out: int, seed: int) -> float:
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(timed(coord, f"r{seed}-{i}", prompt(prompt_len, seed + i), out) for i in range(n)))
    return sum(len(r["times"]) for r in rs) / (time.perf_counter() - t0)


async def serve_rounds(coord, load, seed: int) -> float:
    await coord.start()
    try:
        return await runtime_tok_s(coord, *load, seed)
    finally:
        await coord.stop()


def main() -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model, tok = load_model(CONFIG)
    engine = LLMEngine(CONFIG, model=model, tokenizer=tok)
    profile = coordinator("colocated", 1, backend="inprocess").profile
    systems = ("engine", "inprocess", "process")
    results = {(s, load): [] for s in systems for load in LOADS}
    bar = tqdm(total=args.rounds * len(LOADS) * len(systems), desc="runs", file=sys.stderr)
    for r in range(args.rounds):
        for load, spec in LOADS.items():
            for s in systems:
                seed = 1000 * r
                if s == "engine":
                    results[s, load].append(engine_tok_s(engine, *spec, seed))
                else:
                    coord = coordinator("colocated", 1, backend=s, profile=profile)
                    results[s, load].append(asyncio.run(serve_rounds(coord, spec, seed)))
                bar.update(1)
    bar.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    for load in LOADS:
        base = med["engine", load]
        cells = ", ".join(f"{s} {med[s, load]:.1f} tok/s ({med[s, load] / base:.2f}x)" for s in systems)
        print(f"{load}: {cells}  [medians of {args.rounds}]")
    worst = min(med[s, load] / med["engine", load] for s in ("inprocess", "process") for load in LOADS)
    best_backend = max(("inprocess", "process"), key=lambda s: min(med[s, ld] / med["engine", ld] for ld in LOADS))
    print(
        f"headline: one worker through the World and policy runs at {worst:.2f}x the bare engine's tokens/s "
        f"at worst (best backend: {best_backend})"
    )


if __name__ == "__main__":
    main()
