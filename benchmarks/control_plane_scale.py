"""Control-plane cost at scale (issue 54, ask 1): FluidPD's tick, routing, hand-off and admission vs workers.

The coordinator's hot path alone, outside any simulator or runtime: N workers (the world's own
`WorkerState`s, synthetic state: `fluidpd/bench/control_scale.py`) holding 10 requests in flight per
worker (10,240 at 1,024), Llama-3.1-8B on H100s, TTFT 1 s / TBT 50 ms. Two scenarios:

  steady  5% of the requests queued for prefill, none late: PPI < 1, the balanced state
  burst   30% queued, the oldest 3 TTFT SLOs late: PPI > 1, FluidToken borrows and the shape
          forecast runs every cycle

Each of --periods control periods (10 ms) first moves the cluster on (decode steps, finished requests
replaced by new arrivals, prefills handed off to decode; `churn`), then times one `tick`. Times are
the thread's CPU time (other jobs on a shared host do not inflate them; the wall p99 of the tick is
shown beside), with the garbage collector run between periods, not inside a timed call. The first
--sample arrivals and hand-offs of each period go through the policy (route, handoff) and admission
(`estimate_ttft`), timed. chunked and static-pd (whose tick is empty) are the baseline. Per case:
median and p99 of each, and the per-request decisions one 10 ms period needs at the measured arrival
rate ("decide/10ms": tick + arrivals x (route + handoff + admission) medians). JSON and a PNG go to
--out.

    .venv/bin/python benchmarks/control_plane_scale.py [--quick]
    # default 8, 64, 128, 256, 1,024, 4,096 workers; --quick: 8, 256, 1,024

Last line: the p99 tick at 1,024 workers against the 1 ms goal.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from fluidpd.bench.control_scale import SCENARIOS, Timings, build, churn, quantiles, tick
from fluidpd.bench.plots import scaling_plot

WORKERS = (8, 64, 128, 256, 1024, 4096)
QUICK = (8, 256, 1024)
POLICIES = ("fluidpd", "static-pd", "chunked")
PERIOD_S = 0.010
GOAL_S = 0.001
HEADLINE_N = 1024


def measure(policy: str, n: int, per_worker: int, scenario: str, periods: int, sample: int, seed: int) -> dict:
    cl = build(policy, n, per_worker * n, scenario, seed)
    warm = Timings()
    for _ in range(3):
        churn(cl, PERIOD_S, warm, sample)
        tick(cl, warm)
    t = Timings()
    t0 = time.perf_counter()
    gc.collect()
    gc.disable()  # a collection runs between periods, not inside a timed call (a coordinator would gc.freeze)
    try:
        for _ in range(periods):
            churn(cl, PERIOD_S, t, sample)
            gc.collect(1)
            tick(cl, t)
    finally:
        gc.enable()
    row: dict = {"policy": policy, "workers": n, "in_flight": per_worker * n, "scenario": scenario}
    for kind in ("tick", "route", "handoff", "admission"):
        med, p99, top = quantiles(getattr(t, kind))
        cpu_med, cpu_p99, cpu_top = quantiles(t.cpu.get(kind, []))
        row[kind] = {
            "median_s": med,
            "p99_s": p99,
            "max_s": top,
            "cpu_median_s": cpu_med,
            "cpu_p99_s": cpu_p99,
            "cpu_max_s": cpu_top,
            "samples": len(getattr(t, kind)),
        }
    row["arrivals_per_period"] = t.arrivals / max(t.periods, 1)
    per_req = sum(row[k]["cpu_median_s"] for k in ("route", "handoff", "admission") if row[k]["samples"])
    row["decide_per_period_s"] = row["tick"]["cpu_median_s"] + row["arrivals_per_period"] * per_req
    row["state"] = getattr(cl.policy, "state", "")
    pressure = getattr(cl.policy, "pressure", None)
    row["ppi"], row["dpi"] = (pressure.ppi, pressure.dpi) if pressure is not None else (None, None)
    row["wall_s"] = time.perf_counter() - t0
    return row


def ms(x: float) -> str:
    return f"{1e3 * x:.3f}" if x == x else "-"


def show(row: dict) -> str:
    cells = [f"{row['scenario']:6} {row['policy']:9} {row['workers']:5} {row['in_flight']:6}"]
    for kind in ("tick", "route", "handoff", "admission"):
        cells.append(f"{ms(row[kind]['cpu_median_s']):>8} {ms(row[kind]['cpu_p99_s']):>8}")
    cells.append(f"{ms(row['tick']['p99_s']):>8}")
    cells.append(f"{row['arrivals_per_period']:6.1f} {ms(row['decide_per_period_s']):>9}")
    state = f"{row['state']} PPI {row['ppi']:.2f} DPI {row['dpi']:.2f}" if row["ppi"] is not None else ""
    return "  ".join(cells) + f"  {state}"


HEADER = (
    "thread CPU ms per call (median, p99); tick wall p99 ms; arrivals per 10 ms; decide/10ms: tick + arrivals x "
    "(route + handoff + admission), CPU medians, ms\n"
    "scenario policy  workers in-flight   tick (med, p99)     route (med, p99)    handoff (med, p99)  "
    "admission (med, p99) tick wall p99 arrivals decide/10ms"
)


def plot(rows: list[dict], path: Path) -> None:
    panels: dict = {"tick p99 (s)": {}, "route median (s)": {}, "per-request decisions per 10 ms period (s)": {}}
    # (thread CPU time: what the control plane costs on this CPU, whatever else runs on the host)
    for scenario in SCENARIOS:
        for policy in POLICIES:
            mine = sorted(
                (r for r in rows if r["scenario"] == scenario and r["policy"] == policy), key=lambda r: r["workers"]
            )
            if not mine:
                continue
            x = [r["workers"] for r in mine]
            label = f"{policy} {scenario}"
            if policy == "fluidpd":  # the baselines' tick is empty
                panels["tick p99 (s)"][label] = (x, [max(r["tick"]["cpu_p99_s"], 1e-7) for r in mine])
            panels["route median (s)"][label] = (x, [r["route"]["cpu_median_s"] for r in mine])
            panels["per-request decisions per 10 ms period (s)"][label] = (x, [r["decide_per_period_s"] for r in mine])
    scaling_plot(
        panels,
        "workers",
        path,
        lines={"goal 1 ms": GOAL_S, "period 10 ms": PERIOD_S},
        title="control plane at scale: 10 requests in flight per worker (this CPU, one thread)",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=None)
    ap.add_argument("--quick", action="store_true", help="8, 256 and 1,024 workers, fewer periods")
    ap.add_argument("--per-worker", type=int, default=10, help="requests in flight per worker")
    ap.add_argument("--periods", type=int, default=None, help="timed control periods per case (200; --quick 100)")
    ap.add_argument("--sample", type=int, default=4, help="arrivals and hand-offs per period sent through the policy")
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/control_plane_scale"))
    args = ap.parse_args()
    workers = args.workers or (QUICK if args.quick else WORKERS)
    periods = args.periods if args.periods is not None else (100 if args.quick else 200)
    if periods < 1 or args.per_worker < 1 or args.sample < 1 or min(workers) < 4:
        ap.error("--periods, --per-worker and --sample must be >= 1, and --workers >= 4")
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [(s, n, p) for s in args.scenarios for n in workers for p in args.policies]
    bar = tqdm(cases, desc="control_plane_scale", file=sys.stderr)
    rows = []
    print(HEADER)
    for scenario, n, policy in bar:
        bar.set_postfix_str(f"{scenario} {policy} {n}")
        row = measure(policy, n, args.per_worker, scenario, periods, args.sample, args.seed)
        rows.append(row)
        bar.write(show(row), file=sys.stdout)
    bar.close()
    meta = {"periods": periods, "sample": args.sample, "per_worker": args.per_worker, "python": sys.version.split()[0]}
    (args.out / "control_plane_scale.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, args.out / "control_plane_scale.png")
    print(f"wrote {args.out}/control_plane_scale.json and .png", file=sys.stderr)
    head = [r for r in rows if r["policy"] == "fluidpd" and r["workers"] == HEADLINE_N]
    if not head:
        print("headline: no fluidpd case at 1,024 workers was run")
        return
    parts = [f"{ms(r['tick']['cpu_p99_s'])} ms {r['scenario']} (wall {ms(r['tick']['p99_s'])})" for r in head]
    worst = max(r["tick"]["cpu_p99_s"] for r in head)
    inflight = statistics.mean(r["in_flight"] for r in head)
    print(
        f"p99 tick at 1,024 workers / {inflight:,.0f} requests (thread CPU): {', '.join(parts)} "
        f"(goal <= 1 ms: {'met' if worst <= GOAL_S else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
