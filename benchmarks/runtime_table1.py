"""The seed's Table 1 on the real engine: static-pd, chunked and fluidpd through the real server on
the bursty Azure code trace scaled to this machine, at `make run`'s SLOs (RuntimeConfig's
defaults), with the simulator's prediction of the same table beside it.

For each policy: start `fluidpd serve` (SmolLM2, 4 worker processes, 1 prefill worker to start,
admission off so every system sees every request), replay the trace window with the `fluidpd bench`
client (open loop, streaming: TTFT and every gap measured at the client), stop the server; then
simulate the requests the client sent on this host's profile (`--gpu cpu-host`), same policy,
SLOs and workers, at the step scales that fit a calibration window the same server served first
(as `sim_fidelity.py` does). Prints joint and strict attainment, P99 TTFT and P99 TBT (over all gaps), real
and simulated; writes the rows (JSON) and bar plots (PNG); the headline is the last line.

    cd benchmarks && ../.venv/bin/python runtime_table1.py [--trace azure_code:0.1@9100] [--duration 150]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim_fidelity import (
    add_calibrate_flag,
    calibrated,
    calibration_window,
    parse_trace,
    real_run,
    sent_trace,
    setup_of,
    sim_run,
)

from fluidpd.bench.loadgen.aggregate import collect
from fluidpd.bench.plots import bars_plot
from fluidpd.core.metrics import Slo
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.steplog import read_step_log
from fluidpd.workload.registry import load_trace

SYSTEMS = ("chunked", "static-pd", "fluidpd")


def row(summary: dict) -> dict:
    keys = ("attainment", "strict_attainment", "ttft_p99_s", "tbt_p99_s", "completed", "throughput_tok_s")
    return {k: summary[k] for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure_code:0.1@9100", help="NAME:RATE_SCALE@START (seconds, rate-scaled)")
    ap.add_argument("--duration", type=float, default=150.0)
    ap.add_argument("--max-requests", type=int, default=300)
    ap.add_argument("--max-model-len", type=int, default=512, help="prompt + output clipped to this (both sides)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefill-workers", type=int, default=1)
    ap.add_argument("--policies", nargs="+", default=list(SYSTEMS))
    ap.add_argument("--out", type=Path, default=Path("results/runtime_table1"))
    add_calibrate_flag(ap)
    args = ap.parse_args()
    defaults = RuntimeConfig()
    args.ttft_slo, args.tbt_slo = defaults.ttft_slo_s, defaults.tbt_slo_s
    args.out.mkdir(parents=True, exist_ok=True)
    name, rate, start = parse_trace(args.trace)
    trace = load_trace(name).shaped(rate, args.duration, args.max_requests, start)
    calibration = calibration_window(name, rate, start, args)
    rows = {}
    for i, policy in enumerate(args.policies):
        print(f"{policy}: {len(trace)} requests of {args.trace} through the server ...", file=sys.stderr, flush=True)
        step_log = args.out / f"steps_{policy}.jsonl"
        run = real_run(trace, calibration, name, policy, 8250 + i, args, step_log)
        scales, _ = calibrated(run | {"steps": read_step_log(str(step_log))}, args)
        setup = setup_of(args, scales, run["prefill_workers"])
        sim_mc, sim_tr = sim_run(sent_trace(run["results"], name), policy, setup)
        real_mc, n = collect(run["results"], Slo(args.ttft_slo, args.tbt_slo)), len(run["results"])
        rows[policy] = {
            "requests": n,
            "scales": scales,
            "real": row(real_mc.summary(n)) | {"transitions": run["transitions"]},
            "sim": row(sim_mc.summary(n)) | {"transitions": sim_tr},
        }
    setting = {"trace": args.trace, "duration_s": args.duration, "slo": [args.ttft_slo, args.tbt_slo],
               "workers": args.workers, "max_model_len": args.max_model_len}  # fmt: skip
    (args.out / "table1.json").write_text(json.dumps({"setting": setting, "rows": rows}, indent=1) + "\n")
    for metric, label in (("attainment", "joint SLO attainment"), ("ttft_p99_s", "P99 TTFT (s)")):
        groups = {p: {"real": r["real"][metric], "sim": r["sim"][metric]} for p, r in rows.items()}
        bars_plot(
            groups, label, args.out / f"{metric}.png", f"{args.trace}, SLO {args.ttft_slo:g} s / {args.tbt_slo:g} s"
        )
    print(
        f"Table 1 on the real engine: {args.trace}, {args.duration:g} s, SLO TTFT {args.ttft_slo:g} s / TBT "
        f"{args.tbt_slo:g} s, {args.workers} workers; sim = the profiled simulator on the same requests"
    )
    print(f"{'system':10} {'requests':>8} {'joint':>15} {'strict':>15} {'P99 TTFT ms':>17} {'P99 TBT ms':>15} "
          f"{'transitions':>11}")  # fmt: skip
    for policy, r in rows.items():
        re, si = r["real"], r["sim"]
        print(
            f"{policy:10} {r['requests']:>8} {re['attainment']:>7.1%} ({si['attainment']:>5.1%}) "
            f"{re['strict_attainment']:>7.1%} ({si['strict_attainment']:>5.1%}) "
            f"{re['ttft_p99_s'] * 1e3:>8.0f} ({si['ttft_p99_s'] * 1e3:>6.0f}) "
            f"{re['tbt_p99_s'] * 1e3:>7.0f} ({si['tbt_p99_s'] * 1e3:>5.0f}) "
            f"{len(re['transitions']):>5}/{len(si['transitions'])}"
        )
    print("(real (sim)); rows and plots in", args.out)
    print(
        "table1: joint attainment real/sim "
        + ", ".join(f"{p} {r['real']['attainment']:.1%}/{r['sim']['attainment']:.1%}" for p, r in rows.items())
        + "; P99 TTFT "
        + ", ".join(f"{p} {r['real']['ttft_p99_s']:.2f}/{r['sim']['ttft_p99_s']:.2f} s" for p, r in rows.items())
    )


if __name__ == "__main__":
    main()
