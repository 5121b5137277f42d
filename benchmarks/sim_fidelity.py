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

    .venv/bin/python benchmarks/sim_fidelity.py [--traces azure_conv:0.4@0 azure_code:0.1@9100]
        [--policies chunked static-pd fluidpd] [--duration 150] [--max-model-len 512] [--workers 4]

Each run also writes the server's per-step log (`--step-log`) and prints, per step kind, the real
steps against the model's prediction for their shapes: the engine's time, the wall time through
the runtime (dispatch), the worker's share of a core, the coordinator's CPU use.
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
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import numpy as np
from runtime_azure_code import stop_server, wait_healthy

from fluidpd.bench.host_profile import probe_drift
from fluidpd.bench.loadgen import BenchConfig, BenchResult, collect, run_bench
from fluidpd.bench.plots import cdf_plot, sorted_cdf
from fluidpd.core.metrics import Slo
from fluidpd.engine.config import EngineConfig
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.steplog import StepRecord, read_step_log
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware, shipped_profile
from fluidpd.specs.models import get_model
from fluidpd.workload.registry import load_trace
from fluidpd.workload.trace import Trace

PREFILL_KV_FRACTION = 0.5  # RuntimeConfig's default, given to both sides
# a steady and a bursty trace, each ~1.2 requests/s on average (the bursty one to ~2.5/s for 10 s),
# which keeps 4 workers on 2 cores busy with prompts clipped to 512 tokens
TRACES = ("azure_conv:0.4@0", "azure_code:0.1@9100")


def parse_trace(spec: str) -> tuple[str, float, float]:
    name, _, rest = spec.partition(":")
    rate, _, start = (rest or "1").partition("@")
    return name, float(rate), float(start or 0)


def serve_cmd(policy: str, port: int, args, step_log: Path) -> list[str]:
    return [
        sys.executable, "-m", "fluidpd.cli", "serve", "--model", "smollm2", "--workers", str(args.workers),
        "--prefill-workers", str(args.prefill_workers), "--policy", policy, "--ttft-slo", str(args.ttft_slo),
        "--tbt-slo", str(args.tbt_slo), "--admit-ttft-factor", "0", "--port", str(port),
        "--max-model-len", str(args.max_model_len), "--prefill-kv-fraction", str(PREFILL_KV_FRACTION),
        "--step-log", str(step_log),
    ]  # fmt: skip


def transitions(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^fluidpd:role_transitions_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def host_cpu() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of this host's CPUs so far (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[0] + v[1] + v[2] + v[5] + v[6], v[7], sum(v)


def real_run(trace: Trace, name: str, policy: str, port: int, args, step_log: Path):
    """(collector, results, transitions) of the trace through a fresh server (its steps logged to `step_log`)."""
    url = f"http://127.0.0.1:{port}"
    slo = Slo(args.ttft_slo, args.tbt_slo)
    log_path = Path(tempfile.gettempdir()) / f"fluidpd-fidelity-{name}-{policy}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_cmd(policy, port, args, step_log), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            cfg = BenchConfig(url=url, trace=trace, slo=slo, trace_name=name, progress=False)
            c0, h0 = time.process_time(), host_cpu()
            _, results = asyncio.run(run_bench(cfg))
            busy, steal, total = (b - a for a, b in zip(h0, host_cpu()))
            print(
                f"  client used {time.process_time() - c0:.1f} s of CPU; the host's CPUs {busy / total:.0%} busy, "
                f"{steal / total:.1%} stolen",
                file=sys.stderr,
                flush=True,
            )
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


def setup_of(policy: str, args, drift: dict | None = None) -> Setup:
    drift = drift or {"decode": 1.0, "prefill": 1.0}
    sim = SimConfig(
        n_workers=args.workers,
        prefill_kv_fraction=PREFILL_KV_FRACTION,
        step_scale_decode=drift["decode"],
        step_scale_prefill=drift["prefill"],
    )
    return Setup(
        get_model("smollm2-135m", "fp32"),
        get_hardware("cpu-host"),
        Slo(args.ttft_slo, args.tbt_slo),
        sim=sim,
        policy=PolicyConfig(prefill_workers=args.prefill_workers),
    )


def drift_now() -> dict:
    """The host's speed now against the shipped profile (fluidpd.bench.host_profile.probe_drift)."""
    d = probe_drift(EngineConfig(model="smollm2"), shipped_profile("cpu-host"))
    print(f"  drift probe: decode x{d['decode']:.2f}, prefill x{d['prefill']:.2f} of the profile", file=sys.stderr)
    return d


def sim_run(trace: Trace, policy: str, args, drift: dict | None = None):
    result = simulate(trace, policy, setup_of(policy, args, drift))
    return result.cluster.metrics, len(getattr(result.cluster.policy, "transitions", []))


def step_check(records: list[StepRecord], setup: Setup) -> dict:
    """Per step kind, the real runtime's steps against the model's prediction for the same shape
    (with the host's contention for the steps running when it was sent): median ratios of the
    engine's time and of the wall time to the prediction, median wall - engine and idle times."""
    model = setup.roofline()
    sim = model.sim_config(setup.sim)
    out: dict = {}
    for kind in ("decode", "prefill", "mixed"):
        rs = [r for r in records if r.kind == kind]
        if not rs:
            continue
        scale = sim.step_scale_decode if kind == "decode" else sim.step_scale_prefill
        pred = np.array([model.step_time(r.shape) * scale * contention(sim, r) for r in rs])
        engine, wall = np.array([r.engine_s for r in rs]), np.array([r.wall_s for r in rs])
        out[kind] = {
            "steps": len(rs),
            "engine/pred_p50": float(np.median(engine / pred)),
            "wall/pred_p50": float(np.median(wall / pred)),
            "wall/pred_p99": float(np.percentile(wall / pred, 99)),
            "wall-engine_p50_ms": float(np.median(wall - engine) * 1e3),
            "idle_p50_ms": float(np.median([r.idle_s for r in rs]) * 1e3),
            "core_share_p50": float(np.median([r.engine_cpu_s / r.engine_s for r in rs])),
            "busy_mean": float(np.mean([r.busy for r in rs])),
        }
    span = records[-1].start_s + records[-1].wall_s - records[0].start_s
    out["coordinator_cores"] = (records[-1].coordinator_cpu_s - records[0].coordinator_cpu_s) / span
    return out


def contention(sim: SimConfig, r: StepRecord) -> float:
    """The model's slowdown of a logged step, from the kinds of the steps running when it was sent."""
    decode = r.kind == "decode"
    return sim.contention(decode, r.busy, r.busy_prefill if decode else r.busy - r.busy_prefill)


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


def measure_cases(args):
    """Each trace x policy through a fresh server; yields what the simulator needs of the run
    (and saves it in --out: client results, step log, drift, transitions)."""
    port = 8150
    for spec in args.traces:
        name, rate, start = parse_trace(spec)
        trace = load_trace(name).shaped(rate, args.duration, args.max_requests, start)
        for policy in args.policies:
            port += 1
            print(f"{name} / {policy}: {len(trace)} requests through the server ...", file=sys.stderr, flush=True)
            step_log = args.out / f"steps_{name}_{policy}.jsonl"
            time.sleep(5)  # the previous server's processes are gone before the probe
            drift = drift_now()
            _, results, transitions_ = real_run(trace, name, policy, port, args, step_log)
            case = {"trace": spec, "policy": policy, "drift": drift, "transitions": transitions_}
            (args.out / f"real_{name}_{policy}.json").write_text(
                json.dumps(case | {"results": [asdict(r) for r in results]}) + "\n"
            )
            yield case | {"results": results, "steps": read_step_log(str(step_log))}


def load_cases(args) -> list[dict]:
    """The runs `measure_cases` saved in --out, for re-simulating them after a model change."""
    cases = []
    for spec in args.traces:
        name = parse_trace(spec)[0]
        for policy in args.policies:
            saved = json.loads((args.out / f"real_{name}_{policy}.json").read_text())
            saved["results"] = [BenchResult(**r) for r in saved["results"]]
            saved["steps"] = read_step_log(str(args.out / f"steps_{name}_{policy}.jsonl"))
            cases.append(saved)
    return cases


def run_speed(records: list[StepRecord], policy: str, args) -> dict:
    """The speed level of a run read off its own step log (an oracle: it looks at the evaluated
    run): median engine time over the model's prediction, decode steps and prefill-carrying ones."""
    c = step_check(records, setup_of(policy, args))
    prefill = [c[k] for k in ("prefill", "mixed") if k in c]
    level = max(prefill, key=lambda x: x["steps"])["engine/pred_p50"] if prefill else 1.0
    return {"decode": c["decode"]["engine/pred_p50"] if "decode" in c else 1.0, "prefill": level}


def evaluate(case: dict, args) -> dict:
    """One run's row: real stats, the simulator's (drift-probed, as shipped, and at the run's own
    speed level: an oracle), the per-step check; CDF overlays (PNG)."""
    spec, policy, results, drift = case["trace"], case["policy"], case["results"], case["drift"]
    name = parse_trace(spec)[0]
    slo = Slo(args.ttft_slo, args.tbt_slo)
    steps = step_check(case["steps"], setup_of(policy, args, drift))
    print(f"{spec} / {policy}: drift {drift}", file=sys.stderr)
    for kind, c in steps.items():
        line = " ".join(f"{k} {v:.3g}" for k, v in c.items()) if isinstance(c, dict) else f"{c:.3g}"
        print(f"  {kind:8} {line}", file=sys.stderr, flush=True)
    real_mc, sent, n = collect(results, slo), sent_trace(results, name), len(results)
    sim_mc, sim_tr = sim_run(sent, policy, args, drift)
    raw_mc, _ = sim_run(sent, policy, args)
    speed = run_speed(case["steps"], policy, args)
    oracle_mc, _ = sim_run(sent, policy, args, speed)
    tag = f"{name}_{policy}"
    real_ttft = np.frombuffer(real_mc.ttft, dtype=np.float64)
    sim_ttft = np.frombuffer(sim_mc.ttft, dtype=np.float64)
    cdf_plot({"real": sorted_cdf(real_ttft), "sim": sorted_cdf(sim_ttft)}, "TTFT (s)",
             args.out / f"ttft_cdf_{tag}.png", args.ttft_slo)  # fmt: skip
    cdf_plot({"real": real_mc.tbt.cdf_points(), "sim": sim_mc.tbt.cdf_points()}, "time between tokens (s)",
             args.out / f"tbt_cdf_{tag}.png", args.tbt_slo)  # fmt: skip
    sims = {"sim": stats(sim_mc, n), "sim_unprobed": stats(raw_mc, n), "sim_oracle_speed": stats(oracle_mc, n)}
    transitions_ = {"real": case["transitions"], "sim": sim_tr}
    return {"trace": spec, "policy": policy, "requests": n, "real": stats(real_mc, n), **sims, "drift": drift,
            "run_speed": speed, "transitions": transitions_, "steps": steps}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--traces",
        nargs="+",
        default=list(TRACES),
        help="NAME:RATE_SCALE@START (START: seconds into the rate-scaled trace)",
    )
    ap.add_argument("--policies", nargs="+", default=["chunked", "static-pd", "fluidpd"])
    ap.add_argument("--duration", type=float, default=150.0, help="seconds of each trace (after rate scaling)")
    ap.add_argument("--max-requests", type=int, default=300)
    ap.add_argument("--max-model-len", type=int, default=512, help="prompt + output clipped to this (both sides)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefill-workers", type=int, default=1)
    ap.add_argument("--ttft-slo", type=float, default=10.0)
    ap.add_argument("--tbt-slo", type=float, default=0.6)
    ap.add_argument("--out", type=Path, default=Path("results/sim_fidelity"))
    ap.add_argument("--resim", action="store_true", help="re-simulate the real runs saved in --out (no server)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = load_cases(args) if args.resim else list(measure_cases(args))
    rows = [evaluate(c, args) for c in cases]
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    keys = ("ttft_mean", "ttft_p50", "ttft_p99", "tbt_mean", "tbt_p50", "tbt_p99", "throughput")
    print(f"{'trace':20} {'policy':9} " + " ".join(f"{k:>10}" for k in keys) + "  attain real/sim  transitions r/s")
    for r in rows:
        err = errors(r["real"], r["sim"], keys)
        print(
            f"{r['trace']:20} {r['policy']:9} "
            + " ".join(f"{err[k]:+10.1%}" for k in keys)
            + f"  {r['real']['attainment']:.1%}/{r['sim']['attainment']:.1%}"
            f"  {r['transitions']['real']}/{r['transitions']['sim']}"
        )
    print(f"rows and CDF overlays in {args.out}{os.sep}")
    mean, p99, gap = worst(rows, "sim", keys)
    raw = worst(rows, "sim_unprobed", keys)
    oracle = worst(rows, "sim_oracle_speed", keys)
    print(f"without the drift probe (the profile as shipped): worst mean error {raw[0]:.1%}, worst p99 error "
          f"{raw[1]:.1%}, attainment gap {raw[2]:.1f} pp")  # fmt: skip
    print(f"oracle, at each run's own speed level (read off its step log): worst mean error {oracle[0]:.1%}, "
          f"worst p99 error {oracle[1]:.1%}, attainment gap {oracle[2]:.1f} pp")  # fmt: skip
    print(f"fidelity: worst mean error {mean:.1%}, worst p99 error {p99:.1%}, attainment gap {gap:.1f} pp")


def errors(real: dict, sim: dict, keys) -> dict:
    return {k: sim[k] / real[k] - 1 if real[k] else float("nan") for k in keys}


def worst(rows: list[dict], side: str, keys) -> tuple[float, float, float]:
    """The largest |error| of a mean (TTFT, TBT), of a P99, and of attainment (points) over `rows`."""
    mean = p99 = gap = 0.0
    for r in rows:
        err = errors(r["real"], r[side], keys)
        mean = max(mean, abs(err["ttft_mean"]), abs(err["tbt_mean"]))
        p99 = max(p99, abs(err["ttft_p99"]), abs(err["tbt_p99"]))
        gap = max(gap, abs(100 * (r[side]["attainment"] - r["real"]["attainment"])))
    return mean, p99, gap


if __name__ == "__main__":
    main()
