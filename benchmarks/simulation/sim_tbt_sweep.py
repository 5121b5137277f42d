"""Where disaggregation is worth having: Table 1's quick windows under a TBT SLO sweep.

A tighter SLO_TBT shrinks what a mixed step may carry: chunked prefill's token budget (searched on
the history window at that SLO, under each system's own queue order) and FluidToken's slack alike,
while a prefill worker still prefills at full batch. Per workload and SLO_TBT: chunked late-last
(the strongest aggregated system: its budget searched on history), static-pd at the split searched
on history, and fluidpd starting from that split; joint and strict attainment, and fluidpd minus
chunked late-last. Writes a PNG beside the script's output (`--plot`); the headline is the last line.

    .venv/bin/python benchmarks/simulation/sim_tbt_sweep.py [--tbt-ms 30,35,40] [--workloads azure_code,phase_shift]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from tqdm import tqdm

from fluidpd.bench.experiments.common import QUICK_WINDOW_S, SLO, WORKLOADS, setup
from fluidpd.core.metrics import Slo
from fluidpd.placement.plan import CHUNK_BUDGETS, best_chunk_budget, fixed_split
from fluidpd.sim.run import simulate

SYSTEMS = ("chunked-late-last", "static-pd", "fluidpd")


def point(name: str, tbt_s: float, scale: float) -> dict[str, dict[str, float]]:
    wl = WORKLOADS[name]
    history = wl.history(scale, QUICK_WINDOW_S, 0)
    trace = wl.trace(scale, QUICK_WINDOW_S, 0, wl.start(QUICK_WINDOW_S))
    base = dataclasses.replace(setup(2, 0), slo=Slo(SLO.ttft_s, tbt_s))
    k, _ = fixed_split(history, base)
    budget, _ = best_chunk_budget(history, base, CHUNK_BUDGETS, policy="chunked-late-last")
    split = dataclasses.replace(base, policy=dataclasses.replace(base.policy, prefill_workers=k))
    chunked = dataclasses.replace(base, policy=dataclasses.replace(base.policy, chunk_budget=budget))
    runs = {
        "chunked-late-last": simulate(trace, "chunked-late-last", chunked),
        "static-pd": simulate(trace, "static-pd", split),
        "fluidpd": simulate(trace, "fluidpd", split),
    }
    return {s: {"joint": r.summary["attainment"], "strict": r.summary["strict_attainment"]} for s, r in runs.items()}


def plot(rows: dict, path: str) -> None:
    names = sorted({n for n, _ in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        tbts = sorted(t for n, t in rows if n == name)
        for s in SYSTEMS:
            ax.plot([t * 1000 for t in tbts], [rows[name, t][s]["joint"] * 100 for t in tbts], "o-", label=s)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("SLO_TBT (ms)")
        ax.set_ylabel("joint attainment (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tbt-ms", default="30,35,40", help="SLO_TBT values, ms (comma-separated)")
    ap.add_argument("--workloads", default="azure_code,phase_shift", help="subset of " + ", ".join(WORKLOADS))
    ap.add_argument("--scale", type=float, default=1.0, help="rate scale")
    ap.add_argument("--plot", default="sim_tbt_sweep.png", help="where the figure goes")
    args = ap.parse_args()
    names = args.workloads.split(",")
    if any(n not in WORKLOADS for n in names):
        ap.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    try:
        tbts = [float(x) / 1000 for x in args.tbt_ms.split(",")]
    except ValueError:
        ap.error("--tbt-ms: comma-separated numbers")
    if not tbts or min(tbts) <= 0 or args.scale <= 0:
        ap.error("--tbt-ms and --scale must be > 0")
    rows = {}
    for name in tqdm(names, desc="sim_tbt_sweep", file=sys.stderr):
        for t in tbts:
            r = rows[name, t] = point(name, t, args.scale)
            margin = (r["fluidpd"]["joint"] - r["chunked-late-last"]["joint"]) * 100
            print(
                f"{name:12s} SLO_TBT {t * 1000:4.0f} ms  "
                + "  ".join(f"{s} {v['joint']:6.1%} / {v['strict']:6.1%}" for s, v in r.items())
                + f"  fluidpd - chunked late-last {margin:+.1f} pp",
                flush=True,
            )
    plot(rows, args.plot)
    tight = min(tbts)
    lead = [(rows[n, tight]["fluidpd"]["joint"] - rows[n, tight]["chunked-late-last"]["joint"]) * 100 for n in names]
    print(
        f"at SLO_TBT {tight * 1000:g} ms (joint / strict above), fluidpd minus chunked late-last: "
        + ", ".join(f"{n} {x:+.1f} pp" for n, x in zip(names, lead, strict=True))
    )


if __name__ == "__main__":
    main()
