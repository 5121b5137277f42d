"""How much of FluidPD's lead past saturation is its queue order: Table 1's quick windows, each system
with FCFS and with late-last (a request already past its TTFT SLO waits behind the rest).

chunked (FCFS, as vLLM runs it) and chunked-late-last (the same `stepplan.past_ttft` test and
`on_time_first` order as FluidPD's), each with its token budget tuned on the history window under
its own order, as Table 1 does; fluidpd (from the split tuned on history) with `--queue-order fcfs`
and its default late-last. Joint attainment at every workload and rate scale; deterministic for a
seed. `--seeds 0,1,2`: each point at several seeds (the step jitter's and the tuning's), its mean
printed, with fluidpd minus chunked late-last at each seed (how far one seed's margin can be trusted).

    .venv/bin/python benchmarks/simulation/sim_queue_order.py [--scales 1,2,3] [--workloads azure_code,...] [--seeds 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from tqdm import tqdm

from fluidpd.bench.experiments.common import QUICK_WINDOW_S, WORKLOADS, setup, tune_on_history
from fluidpd.sim.run import simulate


def point(name: str, scale: float, seed: int = 0) -> dict[str, float]:
    wl = WORKLOADS[name]
    history = wl.history(scale, QUICK_WINDOW_S, seed)
    tuned = tune_on_history(history, "auto", seed)
    trace = wl.trace(scale, QUICK_WINDOW_S, seed, wl.start(QUICK_WINDOW_S))
    chunked = setup(2, seed, chunk_budget=tuned["chunk_budget"])
    late_last = setup(2, seed, chunk_budget=tuned["chunk_budget_late_last"])
    fluid = setup(tuned["split"], seed)
    fcfs = dataclasses.replace(fluid, fluid=dataclasses.replace(fluid.fluid, queue_order="fcfs"))
    runs = {
        "chunked fcfs": simulate(trace, "chunked", chunked),
        "chunked late-last": simulate(trace, "chunked-late-last", late_last),
        "fluidpd fcfs": simulate(trace, "fluidpd", fcfs),
        "fluidpd late-last": simulate(trace, "fluidpd", fluid),
    }
    return {k: r.summary["attainment"] for k, r in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,2,3", help="rate scales (comma-separated)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="subset of " + ", ".join(WORKLOADS))
    ap.add_argument("--seeds", default="0", help="seeds (comma-separated): each point's mean over them")
    args = ap.parse_args()
    names = args.workloads.split(",")
    if any(n not in WORKLOADS for n in names):
        ap.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    try:
        scales = [float(x) for x in args.scales.split(",")]
    except ValueError:
        ap.error("--scales: comma-separated numbers")
    if not scales or min(scales) <= 0:
        ap.error("--scales must be > 0")
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        ap.error("--seeds: comma-separated integers")
    rows = {}
    bar = tqdm(total=len(names) * len(scales) * len(seeds), desc="sim_queue_order", file=sys.stderr)
    for name in names:
        for x in scales:
            runs = []
            for seed in seeds:
                runs.append(point(name, x, seed))
                bar.update(1)
            rows[name, x] = r = {k: sum(run[k] for run in runs) / len(runs) for k in runs[0]}
            line = f"{name:12s} x{x:g}  " + "  ".join(f"{k} {v:6.1%}" for k, v in r.items())
            if len(seeds) > 1:
                each = " / ".join(f"{(run['fluidpd late-last'] - run['chunked late-last']) * 100:+.1f}" for run in runs)
                line += f"  (fluidpd - chunked late-last at each seed: {each} pp)"
            print(line, flush=True)
    bar.close()
    gain = {
        k: sum(r[f"{k} late-last"] - r[f"{k} fcfs"] for r in rows.values()) / len(rows) for k in ("chunked", "fluidpd")
    }
    lead = sum(r["fluidpd late-last"] - r["chunked late-last"] for r in rows.values()) / len(rows)
    over = f" and {len(seeds)} seeds" if len(seeds) > 1 else ""
    print(
        f"late-last over FCFS, mean over {len(rows)} points{over}: chunked {gain['chunked'] * 100:+.1f} pp, "
        f"fluidpd {gain['fluidpd'] * 100:+.1f} pp; fluidpd late-last minus chunked late-last {lead * 100:+.1f} pp"
    )


if __name__ == "__main__":
    main()
