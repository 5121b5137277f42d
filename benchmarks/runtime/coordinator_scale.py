"""The runtime's coordinator at scale (issue 54, ask 5): does its 10 ms control cycle hold over 256 and 1,024 workers?

`fluidpd/bench/fake_coordinator.py`: the real `Coordinator` and `RuntimeCluster` on the asyncio loop
and the wall clock (control cycle every 10 ms, heartbeat watch, samplers, `submit` with admission),
over fake workers with no engine and no process, 10 requests in flight per worker (synthetic state,
Llama-3.1-8B on H100s, TTFT 1 s / TBT 50 ms). Every 10 ms the workers' state moves on as finished
steps would move it (`churn`: decode steps observed by the policy, finished requests, prefills handed
off); the first --sample arrivals of each period go through `Coordinator.submit`, the rest are
placed directly. Reported per worker count, CPU times of the loop thread:

  tick       the policy's control cycle (FluidPD: PPI, DPI, forecasts, FluidToken, FluidRole)
  period     wall time between consecutive control cycles (10 ms when the loop has the time)
  churn      the stand-in for the engines' step traffic and the sampled arrivals, per period
  submit     one request's admission, route and enqueue
  needs      what one 10 ms period needs of the loop at the measured arrival rate: tick +
             arrivals x submit (medians); the cycle holds when that is under 10 ms

    .venv/bin/python benchmarks/runtime/coordinator_scale.py [--workers 256 1024] [--seconds 5]
    .venv/bin/python benchmarks/runtime/coordinator_scale.py --policies fluidpd fluidpd-pools

--policies fluidpd-pools: the same coordinator running `fluidpd-pools` (pools of 64): its pools tick
in turn on the one loop (the tick is all of them; a pool on its own core would pay its share), a
request's submit routes in two levels (a pool, then a worker of it).

Last line: whether the coordinator holds the 10 ms cycle at the largest worker count, per policy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tqdm import tqdm

from fluidpd.bench.control_scale import quantiles
from fluidpd.bench.fake_coordinator import PERIOD_S, drive
from fluidpd.bench.scale_cluster import SCENARIOS


def ms(x: float) -> str:
    return f"{1e3 * x:.3f}" if x == x else "-"


def measure(n: int, seconds: float, per_worker: int, scenario: str, sample: int, seed: int, policy_name: str) -> dict:
    coord, st = asyncio.run(drive(n, seconds, per_worker, scenario, sample, policy_name, seed=seed))
    policy = coord.cluster.policy  # type: ignore[union-attr]
    t = st.timings
    pools = getattr(policy, "pools", None)
    row = {
        "policy": policy_name,
        "workers": n,
        "pools": len(pools) if pools else 1,
        "in_flight": per_worker * n,
        "scenario": scenario,
        "cycles": len(t.tick),
    }
    for name, xs in (
        ("tick", t.cpu.get("tick", [])),
        ("period", st.periods),
        ("churn", st.churn_s),
        ("submit", t.cpu.get("submit", [])),
        ("handoff", t.cpu.get("handoff", [])),
    ):
        med, p99, top = quantiles(xs)
        row[name] = {"median_s": med, "p99_s": p99, "max_s": top, "samples": len(xs)}
    row["arrivals_per_period"] = t.arrivals / max(t.periods, 1)
    row["steps_per_period"] = t.steps / max(t.periods, 1)
    row["needs_s"] = row["tick"]["median_s"] + row["arrivals_per_period"] * row["submit"]["median_s"]
    row["loop_busy"] = st.loop_cpu_s / st.wall_s
    row["submitted"], row["refused"] = st.submitted, st.refused
    row["state"], row["ppi"], row["dpi"] = policy.state, policy.pressure.ppi, policy.pressure.dpi
    row["borrowed"] = sum(p.policy.token.borrowed for p in pools) if pools else policy.token.borrowed
    row["holds"] = row["needs_s"] <= PERIOD_S and row["tick"]["p99_s"] <= PERIOD_S
    return row


def show(r: dict) -> str:
    return (
        f"{r['policy']} ({r['pools']} pool{'s' if r['pools'] > 1 else ''}), "
        f"{r['workers']:5} workers, {r['in_flight']:,} in flight ({r['scenario']}), {r['cycles']} cycles: "
        f"tick {ms(r['tick']['median_s'])} / {ms(r['tick']['p99_s'])} ms (median / p99), "
        f"period {ms(r['period']['median_s'])} / {ms(r['period']['p99_s'])} ms, "
        f"churn {ms(r['churn']['median_s'])} ms a period ({r['steps_per_period']:.0f} decode steps), "
        f"submit {ms(r['submit']['median_s'])} / "
        f"{ms(r['submit']['p99_s'])} ms, {r['arrivals_per_period']:.1f} arrivals a period: needs "
        f"{ms(r['needs_s'])} ms of each 10 ms ({'holds' if r['holds'] else 'does NOT hold'}); loop busy "
        f"{100 * r['loop_busy']:.0f}%; decided: {r['state']}, PPI {r['ppi']:.2f}, DPI {r['dpi']:.2f}, "
        f"{r['borrowed']} borrowed"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--seconds", type=float, default=5.0, help="wall seconds each coordinator runs")
    ap.add_argument("--per-worker", type=int, default=10, help="requests in flight per worker")
    ap.add_argument("--scenarios", nargs="+", default=["steady"], choices=list(SCENARIOS))
    ap.add_argument("--sample", type=int, default=4, help="arrivals per period sent through Coordinator.submit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--policies",
        nargs="+",
        default=["fluidpd"],
        choices=["fluidpd", "fluidpd-pools"],
        help="fluidpd-pools: the pools tick in turn on the one loop (a pool's core would pay a share)",
    )
    ap.add_argument("--out", type=Path, default=Path("results/coordinator_scale"))
    args = ap.parse_args()
    if args.seconds <= 0 or args.per_worker < 1 or args.sample < 1 or min(args.workers) < 4:
        ap.error("--seconds must be > 0, --per-worker and --sample >= 1, --workers >= 4")
    rows = []
    cases = [(p, s, n) for p in args.policies for s in args.scenarios for n in args.workers]
    bar = tqdm(cases, desc="coordinator_scale", file=sys.stderr)
    for policy, scenario, n in bar:
        bar.set_postfix_str(f"{policy} {scenario} {n}")
        row = measure(n, args.seconds, args.per_worker, scenario, args.sample, args.seed, policy)
        rows.append(row)
        bar.write(show(row), file=sys.stdout)
    bar.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coordinator_scale.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}/coordinator_scale.json", file=sys.stderr)
    parts = []
    for policy in args.policies:
        top = max((r for r in rows if r["policy"] == policy), key=lambda r: (r["workers"], r["needs_s"]))
        parts.append(
            f"{policy} at {top['workers']:,} fake workers ({top['scenario']}): tick p99 {ms(top['tick']['p99_s'])} ms, "
            f"control period p99 {ms(top['period']['p99_s'])} ms, needs {ms(top['needs_s'])} ms of each 10 ms at "
            f"{top['arrivals_per_period']:.0f} arrivals a period: the 10 ms cycle "
            f"{'holds' if top['holds'] else 'does NOT hold'}"
        )
    print("; ".join(parts))


if __name__ == "__main__":
    main()
