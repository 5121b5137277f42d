"""How much of FluidPD's lead past saturation is its queue order: Table 1's quick windows, each system
with FCFS and with late-last (a request already past its TTFT SLO waits behind the rest).

chunked (FCFS, as vLLM runs it) and chunked-late-last (the same `stepplan.past_ttft` test and
`on_time_first` order as FluidPD's), each with its token budget tuned on the history window under
its own order, as Table 1 does; fluidpd (from the split tuned on history) with `--queue-order fcfs`
and its default late-last. Joint attainment at every workload and rate scale; deterministic.

    .venv/bin/python benchmarks/sim_queue_order.py [--scales 1,2,3] [--workloads azure_code,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from tqdm import tqdm

from fluidpd.bench.experiments.common import QUICK_WINDOW_S, WORKLOADS, setup, tune_on_history
from fluidpd.sim.run import simulate


def point(name: str, scale: float) -> dict[str, float]:
    wl = WORKLOADS[name]
    history = wl.history(scale, QUICK_WINDOW_S, 0)
    tuned = tune_on_history(history, "auto", 0)
    trace = wl.trace(scale, QUICK_WINDOW_S, 0, wl.start(QUICK_WINDOW_S))
    chunked = setup(2, 0, chunk_budget=tuned["chunk_budget"])
    late_last = setup(2, 0, chunk_budget=tuned["chunk_budget_late_last"])
    fluid = setup(tuned["split"], 0)
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
    rows = {}
    for name in tqdm(names, desc="sim_queue_order", file=sys.stderr):
        for x in scales:
            rows[name, x] = point(name, x)
            r = rows[name, x]
            print(f"{name:12s} x{x:g}  " + "  ".join(f"{k} {v:6.1%}" for k, v in r.items()), flush=True)
    gain = {
        k: sum(r[f"{k} late-last"] - r[f"{k} fcfs"] for r in rows.values()) / len(rows) for k in ("chunked", "fluidpd")
    }
    lead = sum(r["fluidpd late-last"] - r["chunked late-last"] for r in rows.values()) / len(rows)
    print(
        f"late-last over FCFS, mean over {len(rows)} points: chunked {gain['chunked'] * 100:+.1f} pp, "
        f"fluidpd {gain['fluidpd'] * 100:+.1f} pp; fluidpd late-last minus chunked late-last {lead * 100:+.1f} pp"
    )


if __name__ == "__main__":
    main()
