"""Simulator speed: the whole Azure conversation trace at rate scale 4 on 8 simulated H100s
(Llama-3.3-70B FP8, static-pd 2P:6D), and a 1,000,000-request synthetic run vs 100,000.

Targets: the Azure run at >= 10k requests/s (NVIDIA Dynamo's mocker replays about 9.8k/s on one
thread); 1M requests <= 5 min and <= 2 GiB peak RSS; the 1M/100k wall-time ratio near 10 (linear).
Each large run goes in its own process so its peak RSS is its own.

    .venv/bin/python benchmarks/sim_speed.py [--quick]   # --quick: 10k/100k instead of 100k/1M
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, time
from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload import load_trace, synthetic

kind, n = sys.argv[1], int(sys.argv[2])
if kind == "azure":
    trace = load_trace("azure_conv").scale_rate(4)
    setup = Setup(get_model("llama-3.3-70b", "fp8"), get_hardware("h100"), Slo(2.0, 0.1),
                  SimConfig(n_workers=8), PolicyConfig(prefill_workers=2))
else:
    trace = synthetic(n, 100.0, prompt_len=("lognormal", 1024, 0.8), output_len=("lognormal", 128, 0.8), seed=0)
    setup = Setup(get_model("llama-3.1-8b", "bf16"), get_hardware("h100"), Slo(1.0, 0.05),
                  SimConfig(n_workers=16), PolicyConfig(prefill_workers=4))
t0 = time.perf_counter()
result = simulate(trace, "static-pd", setup)
wall = time.perf_counter() - t0
print(json.dumps({"requests": len(trace), "completed": result.summary["completed"], "wall_s": wall,
                  "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def run_child(kind: str, n: int = 0) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(n)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10k/100k instead of 100k/1M, one Azure repeat")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    from tqdm import tqdm

    azure = [run_child("azure") for _ in tqdm(range(repeats), desc="azure_conv x4", file=sys.stderr)]
    azure_wall = statistics.median(r["wall_s"] for r in azure)
    azure_rate = azure[0]["requests"] / azure_wall
    print(
        f"azure_conv x4, {azure[0]['requests']} requests, 8 x H100 Llama-3.3-70B FP8 static-pd 2P:6D: "
        f"median wall {azure_wall:.2f} s over {repeats}, {azure_rate / 1e3:.1f}k req/s (target >= 10k), "
        f"completed {azure[0]['completed']}"
    )
    small_n, big_n = (10_000, 100_000) if args.quick else (100_000, 1_000_000)
    t0 = time.perf_counter()
    small = run_child("synthetic", small_n)
    big = run_child("synthetic", big_n)
    print(f"synthetic {small_n:,}: wall {small['wall_s']:.1f} s, peak RSS {small['rss_gib']:.2f} GiB")
    print(
        f"synthetic {big_n:,}: wall {big['wall_s']:.1f} s (target <= 300 s), peak RSS {big['rss_gib']:.2f} GiB "
        f"(target <= 2 GiB), completed {big['completed']:,}"
    )
    print(f"(benchmark took {time.perf_counter() - t0:.0f} s)")
    ratio = big["wall_s"] / small["wall_s"]
    print(
        f"headline: azure_conv x4 static-pd {azure_wall:.2f} s ({azure_rate / 1e3:.1f}k req/s); "
        f"{big_n:,} requests in {big['wall_s']:.0f} s, "
        f"{big['rss_gib']:.2f} GiB peak; wall ratio {big_n // small_n}x requests = {ratio:.2f}"
    )


if __name__ == "__main__":
    main()
