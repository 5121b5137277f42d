"""Overload: a burst of 10x the load the cluster serves within its SLOs, with admission control on.

3 process workers (SmolLM2), fluidpd, open-loop Poisson arrivals: first `--base-rate` req/s for
`--phase-s` seconds (1x), then ten times that for as long (10x). A request refused at submit
(Overloaded: the HTTP server's 429) counts as rejected. Prints the admitted requests' joint SLO
attainment (TTFT <= SLO_TTFT and mean TPOT <= SLO_TBT) at 1x and at 10x (target: as at 1x), the
share rejected at 10x, and peak memory (this process and the largest worker).

    .venv/bin/python benchmarks/runtime/overload.py [--base-rate 1.0] [--phase-s 30] [--prompt-tokens 96]
        [--admit-ttft-factor F] (default: the server's, RuntimeConfig.admit_ttft_factor)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import coordinator, percentile, prompt, timed

from fluidpd.runtime.api import Overloaded
from fluidpd.runtime.config import RuntimeConfig

TTFT_SLO, TBT_SLO, MAX_TOKENS = 5.0, 0.5, 24


def attained(r: dict) -> bool:
    tpot = (r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) if len(r["times"]) > 1 else 0.0
    return len(r["times"]) == MAX_TOKENS and r["ttft"] <= TTFT_SLO and tpot <= TBT_SLO


async def run(args) -> dict:
    coord = coordinator(
        "fluidpd",
        3,
        prefill_workers=1,
        ttft_slo_s=TTFT_SLO,
        tbt_slo_s=TBT_SLO,
        admit_ttft_factor=args.admit_ttft_factor,
    )
    await coord.start()
    rng = random.Random(0)
    predicted: dict[str, float] = {}  # what admission control saw for each request at submit
    phases: dict[str, dict] = {"1x": {"tasks": [], "rejected": 0}, "10x": {"tasks": [], "rejected": 0}}
    try:
        t0, i = time.perf_counter(), 0
        for name, rate in (("1x", args.base_rate), ("10x", 10 * args.base_rate)):
            end, nxt = time.perf_counter() - t0 + args.phase_s, time.perf_counter() - t0
            while (now := time.perf_counter() - t0) < end:
                if now >= nxt:
                    ids = prompt(args.prompt_tokens, seed=i)
                    predicted[f"r{i}"] = coord.ttft_estimate(ids).total_s
                    task = asyncio.create_task(timed(coord, f"r{i}", ids, MAX_TOKENS))
                    await asyncio.sleep(0)  # let it submit: Overloaded surfaces from the task
                    phases[name]["tasks"].append(task)
                    i += 1
                    nxt += rng.expovariate(rate)
                await asyncio.sleep(0.005)
        for p in phases.values():
            done = []
            for t in p["tasks"]:
                try:
                    done.append(await asyncio.wait_for(t, 600))
                except Overloaded:
                    p["rejected"] += 1
            p["results"] = done
    finally:
        await coord.stop()
    out = {}
    for name, p in phases.items():
        res = p["results"]
        out[name] = {
            "offered": len(p["tasks"]),
            "rejected": p["rejected"],
            "attainment": sum(map(attained, res)) / len(res) if res else float("nan"),
            "ttft_misses": sum(1 for r in res if r["ttft"] > TTFT_SLO),
            "tpot_misses": sum(1 for r in res if r["ttft"] <= TTFT_SLO and not attained(r)),
            "actual_over_predicted": percentile([r["ttft"] / max(predicted[r["id"]], 1e-3) for r in res], 0.5),
            "ttft_p99": percentile([r["ttft"] for r in res], 0.99),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-rate", type=float, default=1.0)
    ap.add_argument("--phase-s", type=float, default=30.0)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--admit-ttft-factor", type=float, default=RuntimeConfig().admit_ttft_factor)
    args = ap.parse_args()
    r = asyncio.run(run(args))
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    for name, p in r.items():
        print(
            f"{name}: {p['offered']} offered, {p['rejected']} rejected, admitted attainment {p['attainment']:.1%} "
            f"(misses: {p['ttft_misses']} TTFT, {p['tpot_misses']} TPOT only; P99 TTFT {p['ttft_p99']:.2f} s; "
            f"measured / predicted TTFT, median {p['actual_over_predicted']:.2f})"
        )
    share = r["10x"]["rejected"] / max(1, r["10x"]["offered"])
    print(f"peak RSS: coordinator {peak_self:.0f} MiB, largest worker {peak_child:.0f} MiB")
    print(
        f"headline: at 10x load admission control (--admit-ttft-factor {args.admit_ttft_factor:g}) rejected "
        f"{share:.0%}; admitted attainment "
        f"{r['10x']['attainment']:.1%} vs {r['1x']['attainment']:.1%} at 1x"
    )


if __name__ == "__main__":
    main()
