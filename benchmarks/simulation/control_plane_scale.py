"""Control-plane cost at scale (issue 54, ask 1): FluidPD's tick, routing, hand-off and admission vs workers.

The coordinator's hot path alone, outside any simulator or runtime: N workers (the world's own
`WorkerState`s, synthetic state: `fluidpd/bench/scale_cluster.py`) holding 10 requests in flight per
worker (10,240 at 1,024), Llama-3.1-8B on H100s, TTFT 1 s / TBT 50 ms. Two scenarios:

  steady  5% of the requests queued for prefill, none late: PPI < 1, the balanced state
  burst   30% queued, the oldest 3 TTFT SLOs late: PPI > 1, FluidToken borrows and the shape
          forecast runs every cycle

Each of --periods control periods (10 ms) first moves the cluster on (decode steps, finished requests
replaced by new arrivals, prefills handed off to decode; `churn`), then times one `tick`. Times are
the thread's CPU time (other jobs on a shared host do not inflate them; the wall p99 of the tick is
shown beside), with the garbage collector run between periods, not inside a timed call. The first
--sample arrivals and hand-offs of each period go through the policy (route, handoff) and admission
(`estimate_ttft`), timed. chunked and static-pd (whose tick is empty) are the baseline.
fluidpd-pools (pools of --pool-size workers, each its own FluidPD loop) is timed per pool: each
pool's tick on its own (what that pool's core pays), the router tier's pick of a pool per request
(within the route), admission over the chosen pool's workers, and what a 10 ms period needs of one
pool's core (its tick + its share of the arrivals x its route, hand-off and admission) and of the
tier's (its tick + every arrival's pick). Per case:
median and p99 of each, and the per-request decisions one 10 ms period needs at the measured arrival
rate ("decide/10ms": tick + arrivals x (route + handoff + admission) medians). JSON and a PNG go to
--out.

    .venv/bin/python benchmarks/simulation/control_plane_scale.py [--quick] [--policies fluidpd fluidpd-pools]
        [--pool-size 64]
    # default 8, 64, 128, 256, 1,024, 4,096 workers; --quick: 8, 256, 1,024
    .venv/bin/python benchmarks/simulation/control_plane_scale.py --sim [--gpus 64 256]
    # instead: azure_code simulated, fluidpd vs fluidpd-pools (attainment, P99 TTFT and TBT)

Last line: the p99 tick at 1,024 workers against the 1 ms goal, one coordinator's (fluidpd) and one
pool's (fluidpd-pools); with --sim, the pooled design's worst attainment against fluidpd's.
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

from fluidpd.bench.control_scale import Timings, churn, quantiles, tick
from fluidpd.bench.plots import scaling_plot
from fluidpd.bench.scale_cluster import SCENARIOS, build

WORKERS = (8, 64, 128, 256, 1024, 4096)
QUICK = (8, 256, 1024)
POLICIES = ("fluidpd", "fluidpd-pools", "static-pd", "chunked")
PERIOD_S = 0.010
GOAL_S = 0.001
HEADLINE_N = 1024


def measure(
    policy: str, n: int, per_worker: int, scenario: str, periods: int, sample: int, seed: int, pool_size: int = 0
) -> dict:
    cl = build(policy, n, per_worker * n, scenario, seed, pool_size)
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
    for kind in ("tick", "route", "handoff", "admission", "pool_tick", "tier_tick", "tier_route"):
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
    pools = getattr(cl.policy, "pools", None)
    if pools is not None:  # what one pool's core and the router tier each need a period
        row["pools"] = len(pools)
        in_pool = per_req - row["tier_route"]["cpu_median_s"]  # its route among its workers, hand-off, admission
        row["pool_decide_per_period_s"] = (
            row["pool_tick"]["cpu_median_s"] + row["arrivals_per_period"] / len(pools) * in_pool
        )
        row["tier_per_period_s"] = (
            row["tier_tick"]["cpu_median_s"] + row["arrivals_per_period"] * (row["tier_route"]["cpu_median_s"])
        )
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
    line = "  ".join(cells) + f"  {state}"
    if "pools" in row:
        pt, tr = row["pool_tick"], row["tier_route"]
        line += (
            f"\n{'':31}{row['pools']} pools: pool tick {ms(pt['cpu_median_s'])} / {ms(pt['cpu_p99_s'])} ms "
            f"(median / p99), tier route {ms(tr['cpu_median_s'])} ms, tier tick {ms(row['tier_tick']['cpu_median_s'])}"
            f" ms; a 10 ms period needs {ms(row['pool_decide_per_period_s'])} ms of each pool's core, "
            f"{ms(row['tier_per_period_s'])} ms of the tier's"
        )
    return line


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
            if policy == "fluidpd-pools":  # what one pool's core pays
                pool = f"one pool of fluidpd-pools {scenario}"
                panels["tick p99 (s)"][pool] = (x, [max(r["pool_tick"]["cpu_p99_s"], 1e-7) for r in mine])
                panels["per-request decisions per 10 ms period (s)"][pool] = (
                    x,
                    [r["pool_decide_per_period_s"] for r in mine],
                )
    scaling_plot(
        panels,
        "workers",
        path,
        lines={"goal 1 ms": GOAL_S, "period 10 ms": PERIOD_S},
        title="control plane at scale: 10 requests in flight per worker (this CPU, one thread)",
    )


SIM_LOADS = {"1x": (0.5, 10.0), "4x": (2.0, 20.0)}  # azure_code rate scale per GPU, seconds of the trace kept


def simulate_pools(gpus: list[int], pool_size: int) -> None:
    """azure_code on N simulated H100s (Llama-3.1-8B, SLO 2 s / 40 ms, 8 GPUs a node: sim_speed.py
    --scale's setup) at its load (1x: rate scale N/2, the first 10 s) and 4x that (the first 20 s),
    under fluidpd and fluidpd-pools (pools of `pool_size`, and of 16); side by side."""
    from fluidpd.core.metrics import Slo
    from fluidpd.policy.base import PolicyConfig
    from fluidpd.policy.fluidconfig import FluidConfig
    from fluidpd.sim.config import SimConfig
    from fluidpd.sim.run import Setup, simulate
    from fluidpd.specs.hardware import get_hardware
    from fluidpd.specs.models import get_model
    from fluidpd.workload import load_trace

    sizes = sorted({pool_size or FluidConfig().pool_size, 16}, reverse=True)
    print("load gpus policy              requests attainment strict  P99 TTFT s  P99 TBT ms  pool moves  wall s")
    worst = 0.0
    for load, (per_gpu, span) in SIM_LOADS.items():
        for n in gpus:
            trace = load_trace("azure_code").scale_rate(n * per_gpu).window(0.0, span)
            plain_att = None
            for policy, size in [("fluidpd", 0), *(("fluidpd-pools", k) for k in sizes)]:
                fluid = FluidConfig(pool_size=size) if size else FluidConfig()
                setup = Setup(
                    get_model("llama-3.1-8b", "bf16"),
                    get_hardware("h100"),
                    Slo(2.0, 0.04),
                    SimConfig(n_workers=n, gpus_per_node=8),
                    PolicyConfig(),
                    fluid=fluid,
                )
                t0 = time.perf_counter()
                r = simulate(trace, policy, setup)
                wall = time.perf_counter() - t0
                s = r.summary
                balance = getattr(r.cluster.policy, "balance", None)
                moves = sum(m.outcome == "moved" for m in balance.moves) if balance is not None else 0
                name = f"{policy}/{size}" if size else policy
                print(
                    f"{load:4} {n:4} {name:18} {s['completed']:5}/{s['requests']:<5} {s['attainment']:9.4f} "
                    f"{s['strict_attainment']:7.4f} {s['ttft_p99_s']:10.3f} {1e3 * s['tbt_p99_s']:10.2f} "
                    f"{moves:10} {wall:7.1f}",
                    flush=True,
                )
                if plain_att is None:
                    plain_att = s["attainment"]
                else:
                    worst = min(worst, s["attainment"] - plain_att)
    print(f"fluidpd-pools vs fluidpd, azure_code at {'/'.join(map(str, gpus))} GPUs: attainment at worst {worst:+.4f}")


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
    ap.add_argument("--pool-size", type=int, default=0, help="fluidpd-pools: workers per pool (0: its default, 64)")
    ap.add_argument("--sim", action="store_true", help="instead: simulate azure_code, fluidpd vs fluidpd-pools")
    ap.add_argument("--gpus", type=int, nargs="+", default=[64, 256], help="with --sim")
    ap.add_argument("--out", type=Path, default=Path("results/control_plane_scale"))
    args = ap.parse_args()
    if args.sim:
        simulate_pools(args.gpus, args.pool_size)
        return
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
        row = measure(policy, n, args.per_worker, scenario, periods, args.sample, args.seed, args.pool_size)
        rows.append(row)
        bar.write(show(row), file=sys.stdout)
    bar.close()
    meta = {"periods": periods, "sample": args.sample, "per_worker": args.per_worker, "python": sys.version.split()[0]}
    (args.out / "control_plane_scale.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, args.out / "control_plane_scale.png")
    print(f"wrote {args.out}/control_plane_scale.json and .png", file=sys.stderr)
    print(headline(rows))


def headline(rows: list[dict]) -> str:
    """The p99 tick at 1,024 workers: one coordinator's (fluidpd), one pool's (fluidpd-pools)."""
    out = []
    for policy, key, what in (("fluidpd", "tick", "one coordinator"), ("fluidpd-pools", "pool_tick", "one pool")):
        head = [r for r in rows if r["policy"] == policy and r["workers"] == HEADLINE_N]
        if not head:
            continue
        parts = [f"{ms(r[key]['cpu_p99_s'])} ms {r['scenario']}" for r in head]
        worst = max(r[key]["cpu_p99_s"] for r in head)
        out.append(f"{what} ({policy}) {', '.join(parts)} (goal <= 1 ms: {'met' if worst <= GOAL_S else 'NOT met'})")
    if not out:
        return "headline: no fluidpd or fluidpd-pools case at 1,024 workers was run"
    inflight = statistics.mean(r["in_flight"] for r in rows if r["workers"] == HEADLINE_N)
    return f"p99 tick at 1,024 workers / {inflight:,.0f} requests (thread CPU): " + "; ".join(out)


if __name__ == "__main__":
    main()
