"""n > 1: one request sampling n sequences from one prefill, against n separate requests of the same prompt.

n = 8 on a 1,000-token prompt with 64 output tokens each (temperature 1, ignore_eos), on one worker
(colocated) and through a 1P+2D static-pd cluster (process workers), with prefix caching on (the default:
the 7 later separate requests find the first one's prompt cached) and off. Measured per round: the prefill
tokens the workers computed (every planned chunk, counted where the coordinator sends it: prefix-cache
hits are not computed, so 8 separate requests that find the first one's prompt cached are credited for
it) and the wall time from submit to the last token of all 8 sequences. Interleaved rounds, medians.
Goals (issue 51): prefill tokens 1x vs 8x, wall time <= 0.35x of the 8 separate requests.

    .venv/bin/python benchmarks/runtime/parallel_sampling.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import CONFIG, coordinator, prompt

from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.api import GenerationRequest

N, PROMPT, OUT = 8, 1000, 64
SETUPS = {  # name: (policy, workers, prefill workers, prefix caching)
    "1 worker": ("colocated", 1, 0, True),
    "1P+2D": ("static-pd", 3, 1, True),
    "1 worker, no prefix cache": ("colocated", 1, 0, False),
    "1P+2D, no prefix cache": ("static-pd", 3, 1, False),
}


async def run(coord, group: bool, seed: int) -> tuple[int, float, int]:
    """(prefill tokens computed, wall seconds, output tokens) of one round."""
    cl = coord.cluster
    computed = [0]
    execute = cl.execute

    def counting(w, plan, shape):
        computed[0] += sum(c for _, c in plan.chunks)
        execute(w, plan, shape)

    cl.execute = counting
    ids = prompt(PROMPT, seed)
    params = SamplingParams(max_tokens=OUT, temperature=1.0, ignore_eos=True, seed=seed)
    if group:
        reqs = [GenerationRequest(f"g{seed}", ids, replace(params, n=N))]
    else:
        reqs = [GenerationRequest(f"s{seed}-{j}", ids, replace(params, seed=seed + j)) for j in range(N)]
    t0 = time.perf_counter()
    streams = [coord.submit(r) for r in reqs]

    async def drain(stream) -> int:
        n = 0
        async for ev in stream:
            assert ev.finish_reason not in ("error", "abort"), ev.error
            n += len(ev.token_ids)
        return n

    tokens = sum(await asyncio.gather(*(drain(s) for s in streams)))
    wall = time.perf_counter() - t0
    cl.execute = execute
    return computed[0], wall, tokens


async def setup_rounds(name: str, rounds: int, bar) -> dict:
    policy, workers, prefill, caching = SETUPS[name]
    # 8 separate sequences hold 8 x 1,064 tokens: room for all (no preemption)
    config = replace(CONFIG, num_kv_blocks=1024, enable_prefix_caching=caching)
    coord = coordinator(policy, workers, prefill_workers=prefill, config=config)
    await coord.start()
    out: dict[str, list] = {"group": [], "separate": []}
    try:
        for r in range(rounds):
            for kind in ("group", "separate") if r % 2 == 0 else ("separate", "group"):
                res = await run(coord, kind == "group", seed=100 * r + (kind == "group"))
                assert res[2] == N * OUT, res
                out[kind].append(res)
                bar.update(1)
    finally:
        await coord.stop()
    return out


def main() -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    bar = tqdm(total=2 * args.rounds * len(SETUPS), desc="rounds")
    heads = []
    for name in SETUPS:
        res = asyncio.run(setup_rounds(name, args.rounds, bar))
        g_pre = statistics.median(r[0] for r in res["group"])
        s_pre = statistics.median(r[0] for r in res["separate"])
        g_wall = statistics.median(r[1] for r in res["group"])
        s_wall = statistics.median(r[1] for r in res["separate"])
        tqdm.write(
            f"{name}: prefill tokens n=8 {g_pre:.0f} vs 8 separate {s_pre:.0f} ({s_pre / g_pre:.2f}x as many); "
            f"wall n=8 {g_wall:.2f} s vs 8 separate {s_wall:.2f} s ({g_wall / s_wall:.2f}x)"
        )
        heads.append(f"{name} {g_pre / PROMPT:.2f}x/{s_pre / PROMPT:.2f}x prefill, wall {g_wall / s_wall:.2f}x")
    bar.close()
    print(f"n=8 vs 8 separate requests (prompt {PROMPT}, {OUT} out): " + "; ".join(heads))


if __name__ == "__main__":
    main()
