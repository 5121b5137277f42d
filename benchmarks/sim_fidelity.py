"""Simulator fidelity: the same requests through the real server and through the simulator on this
host's profile (`--gpu cpu-host`), per policy and trace, with each metric's error.

For each trace and policy: start `fluidpd serve` (SmolLM2, `--workers`, `--prefill-workers` to
start, admission off so both sides see every request), replay the trace window with the `fluidpd
bench` client in this process (open loop, streaming, client-side TTFT and every gap), read the
role transitions from /metrics, stop the server. Then simulate the requests the client actually
sent (their send times, clipped prompt and output lengths) with the same policy, SLOs, workers,
prefill KV share and starting split. Compares mean, P50 and P99 of TTFT and TBT, joint attainment,
output throughput and FluidRole transitions; writes a sim-vs-real CDF overlay per metric (PNG) and
the rows as JSON.

    .venv/bin/python benchmarks/sim_fidelity.py [--traces azure_conv azure_code] [--policies chunked static-pd fluidpd]
        [--rate-scale 0.05] [--duration 300] [--max-requests 150] [--max-model-len 512] [--workers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
from runtime_azure_code import stop_server, wait_healthy

from fluidpd.bench.loadgen import BenchConfig, collect, run_bench
from fluidpd.bench.plots import cdf_plot, sorted_cdf
from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.registry import load_trace
from fluidpd.workload.trace import Trace

PREFILL_KV_FRACTION = 0.5  # RuntimeConfig's default, given to both sides


def serve_cmd(policy: str, port: int, args) -> list[str]:
    return [
        sys.executable, "-m", "fluidpd.cli", "serve", "--model", "smollm2", "--workers", str(args.workers),
        "--prefill-workers", str(args.prefill_workers), "--policy", policy, "--ttft-slo", str(args.ttft_slo),
        "--tbt-slo", str(args.tbt_slo), "--admit-ttft-factor", "0", "--port", str(port),
        "--max-model-len", str(args.max_model_len), "--prefill-kv-fraction", str(PREFILL_KV_FRACTION),
    ]  # fmt: skip


def transitions(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^fluidpd:role_transitions_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def real_run(trace: Trace, name: str, policy: str, port: int, args):
    """(collector, results, transitions) of the trace through a fresh server."""
    url = f"http://127.0.0.1:{port}"
    slo = Slo(args.ttft_slo, args.tbt_slo)
    log_path = Path(tempfile.gettempdir()) / f"fluidpd-fidelity-{name}-{policy}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_cmd(policy, port, args), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            cfg = BenchConfig(url=url, trace=trace, slo=slo, trace_name=name, progress=False)
            _, results = asyncio.run(run_bench(cfg))
            return collect(results, slo), results, transitions(url)
        finally:
            stop_server(proc)


def sent_trace(results, name: str) -> Trace:
    """The requests as the client sent them: send time, prompt length, (clipped) output length."""
    rs = sorted((r for r in results if not np.isnan(r.send_s)), key=lambda r: r.send_s)
    t0 = rs[0].send_s
    return Trace(
        name,
        np.array([r.send_s - t0 for r in rs]),
        np.array([r.prompt_len for r in rs]),
        np.array([max(1, r.max_tokens) for r in rs]),
    )


def sim_run(trace: Trace, policy: str, args):
    setup = Setup(
        get_model("smollm2-135m", "fp32"),
        get_hardware("cpu-host"),
        Slo(args.ttft_slo, args.tbt_slo),
        sim=SimConfig(n_workers=args.workers, prefill_kv_fraction=PREFILL_KV_FRACTION),
        policy=PolicyConfig(prefill_workers=args.prefill_workers),
    )
    result = simulate(trace, policy, setup)
    return result.cluster.metrics, len(getattr(result.cluster.policy, "transitions", []))


def stats(mc, requests: int) -> dict:
    ttft = np.frombuffer(mc.ttft, dtype=np.float64) if mc.ttft else np.array([np.nan])
    s = mc.summary(requests)
    return {
        "ttft_mean": float(ttft.mean()),
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "tbt_mean": mc.tbt.mean,
        "tbt_p50": mc.tbt.quantile(0.5),
        "tbt_p99": mc.tbt.quantile(0.99),
        "attainment": s["attainment"],
        "throughput": s["throughput_tok_s"],
        "completed": s["completed"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", default=["azure_conv", "azure_code"])
    ap.add_argument("--policies", nargs="+", default=["chunked", "static-pd", "fluidpd"])
    ap.add_argument("--rate-scale", type=float, default=0.05)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of each trace (after rate scaling)")
    ap.add_argument("--max-requests", type=int, default=150)
    ap.add_argument("--max-model-len", type=int, default=512, help="prompt + output clipped to this (both sides)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefill-workers", type=int, default=1)
    ap.add_argument("--ttft-slo", type=float, default=10.0)
    ap.add_argument("--tbt-slo", type=float, default=0.6)
    ap.add_argument("--out", type=Path, default=Path("results/sim_fidelity"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, port = [], 8150
    for name in args.traces:
        trace = load_trace(name).shaped(args.rate_scale, args.duration, args.max_requests)
        for policy in args.policies:
            port += 1
            print(f"{name} / {policy}: {len(trace)} requests through the server ...", file=sys.stderr, flush=True)
            real_mc, results, real_tr = real_run(trace, name, policy, port, args)
            raw = [{"send_s": r.send_s, "prompt_len": r.prompt_len, "max_tokens": r.max_tokens, "token_s": r.token_s,
                    "error": r.error} for r in results]  # fmt: skip
            (args.out / f"real_{name}_{policy}.json").write_text(json.dumps(raw) + "\n")
            sim_mc, sim_tr = sim_run(sent_trace(results, name), policy, args)
            real, sim = stats(real_mc, len(results)), stats(sim_mc, len(results))
            rows.append({"trace": name, "policy": policy, "requests": len(results), "real": real, "sim": sim,
                         "transitions": {"real": real_tr, "sim": sim_tr}})  # fmt: skip
            tag = f"{name}_{policy}"
            real_ttft = np.frombuffer(real_mc.ttft, dtype=np.float64)
            sim_ttft = np.frombuffer(sim_mc.ttft, dtype=np.float64)
            cdf_plot({"real": sorted_cdf(real_ttft), "sim": sorted_cdf(sim_ttft)}, "TTFT (s)",
                     args.out / f"ttft_cdf_{tag}.png", args.ttft_slo)  # fmt: skip
            cdf_plot({"real": real_mc.tbt.cdf_points(), "sim": sim_mc.tbt.cdf_points()}, "time between tokens (s)",
                     args.out / f"tbt_cdf_{tag}.png", args.tbt_slo)  # fmt: skip
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    keys = ("ttft_mean", "ttft_p50", "ttft_p99", "tbt_mean", "tbt_p50", "tbt_p99", "throughput")
    print(f"{'trace':11} {'policy':9} " + " ".join(f"{k:>10}" for k in keys) + "  attain real/sim  transitions r/s")
    worst_mean = worst_p99 = worst_gap = 0.0
    for r in rows:
        err = {k: r["sim"][k] / r["real"][k] - 1 if r["real"][k] else float("nan") for k in keys}
        gap = 100 * (r["sim"]["attainment"] - r["real"]["attainment"])
        worst_mean = max(worst_mean, abs(err["ttft_mean"]), abs(err["tbt_mean"]))
        worst_p99 = max(worst_p99, abs(err["ttft_p99"]), abs(err["tbt_p99"]))
        worst_gap = max(worst_gap, abs(gap))
        print(
            f"{r['trace']:11} {r['policy']:9} "
            + " ".join(f"{err[k]:+10.1%}" for k in keys)
            + f"  {r['real']['attainment']:.1%}/{r['sim']['attainment']:.1%}"
            f"  {r['transitions']['real']}/{r['transitions']['sim']}"
        )
    print(f"rows and CDF overlays in {args.out}{os.sep}")
    print(
        f"fidelity: worst mean error {worst_mean:.1%}, worst p99 error {worst_p99:.1%}, "
        f"attainment gap {worst_gap:.1f} pp"
    )


if __name__ == "__main__":
    main()
