"""Control-plane overhead in the simulator: wall time of fluidpd (PPI/DPI, FluidToken and FluidRole
evaluated every 10 ms of virtual time) vs static-pd 2P:6D on the same trace.

Setting: Table 1's (8 x H100, Llama-3.3-70B FP8, SLO TTFT 2 s / TBT 40 ms, jitter CV 0.05).
Traces: azure_code x1 and azure_conv x1.5, first 600 s each. Median of 3 runs per policy and trace
(the simulation loop only; setup excluded). Target: fluidpd no more than 3x slower than static-pd.

    .venv/bin/python benchmarks/simulation/control_plane_overhead.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from tqdm import tqdm

from fluidpd.bench.experiments.common import setup
from fluidpd.sim.run import simulate
from fluidpd.workload import load_trace

CASES = (("azure_code", 1.0), ("azure_conv", 1.5))
WINDOW_S = 600.0
POLICIES = ("static-pd", "fluidpd")
TARGET = 3.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    ratios = {}
    bar = tqdm(total=len(CASES) * len(POLICIES) * args.repeats, desc="runs", file=sys.stderr)
    for name, scale in CASES:
        trace = load_trace(name).scale_rate(scale).window(0.0, WINDOW_S)
        walls, events = {}, {}
        for policy in POLICIES:
            w = []
            for _ in range(args.repeats):
                res = simulate(trace, policy, setup(2))
                w.append(res.summary["sim_wall_s"])
                events[policy] = res.cluster.loop.events_run
                bar.update(1)
            walls[policy] = statistics.median(w)
        ratios[f"{name} x{scale:g}"] = walls["fluidpd"] / walls["static-pd"]
        bar.write(
            f"{name} x{scale:g}, {len(trace)} requests, {WINDOW_S:g} s: static-pd {walls['static-pd']:.2f} s "
            f"({events['static-pd']:,} events), fluidpd {walls['fluidpd']:.2f} s ({events['fluidpd']:,} events); "
            f"ratio {ratios[f'{name} x{scale:g}']:.2f}x",
            file=sys.stdout,
        )
    bar.close()
    worst = max(ratios, key=ratios.get)
    print(
        f"control-plane overhead: fluidpd / static-pd simulation wall time = {ratios[worst]:.2f}x at worst "
        f"({worst}; median of {args.repeats}), target <= {TARGET:g}x: {'met' if ratios[worst] <= TARGET else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
