"""Simulator fidelity: the same requests through the real server and through the simulator on this
host's profile (`--gpu cpu-host`), per policy and trace, with each metric's error.

For each trace and policy: start `fluidpd serve` (SmolLM2, `--workers`, `--prefill-workers` to
start, admission off so both sides see every request); first serve a calibration window (the
`--calibrate-s` of trace right after the evaluated window, same rate); then replay the evaluated
window with the `fluidpd bench` client in this process (open loop, streaming, client-side TTFT and
every gap), read the role transitions from /metrics, stop the server. Then simulate the requests
the client actually sent (their send times, clipped prompt and output lengths) with the same
policy, SLOs, workers, prefill KV share and split, at the step scales that fit the calibration
window's logged steps (`fluidpd.bench.step_check.speed_level`: this host's speed drifts by tens
of percent over minutes). Compares mean, P50 and P99 of TTFT and TBT, joint attainment, output
throughput and FluidRole transitions; writes a sim-vs-real CDF overlay per metric (PNG) and the
rows as JSON. Also printed: the simulator uncalibrated, at the evaluated run's own speed level
(an oracle) and, with `--baseline DIR`, an earlier run's real results against these (the real
system's own run-to-run spread).

    .venv/bin/python benchmarks/simulation/sim_fidelity.py [--traces azure_conv:0.4@0 azure_code:0.1@9100]
        [--policies chunked static-pd fluidpd] [--duration 150] [--max-model-len 512] [--workers 4]
        [--baseline results/sim_fidelity_before] [--resim]

Each run writes the server's per-step log (`--step-log`) and prints, per step kind, the real steps
against the model's prediction for their shapes: the engine's time, the wall time through the
runtime (dispatch, KV exports queued before the step), the worker's share of a core, the
coordinator's CPU use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # runtime_azure_code
from runtime_azure_code import stop_server, wait_healthy

from fluidpd.bench.capacity import PREFILL_KV_FRACTION, Window, host_setup
from fluidpd.bench.loadgen.aggregate import collect
from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.bench.loadgen.run import BenchConfig, run_bench
from fluidpd.bench.peers.process import SERVE
from fluidpd.bench.plots import cdf_plot, sorted_cdf
from fluidpd.bench.step_check import speed_level, step_check
from fluidpd.core.metrics import Slo
from fluidpd.runtime.steplog import read_step_log
from fluidpd.sim.run import Setup, simulate
from fluidpd.workload.trace import Trace

# a steady and a bursty trace, each ~1.2 requests/s on average (the bursty one to ~2.5/s for 10 s),
# which keeps 4 workers on 2 cores busy with prompts clipped to 512 tokens
TRACES = ("azure_conv:0.4@0", "azure_code:0.1@9100")


def serve_cmd(policy: str, port: int, args, step_log: Path) -> list[str]:
    return [
        *SERVE, "--model", "smollm2", "--workers", str(args.workers),
        "--prefill-workers", str(args.prefill_workers), "--policy", policy, "--ttft-slo", str(args.ttft_slo),
        "--tbt-slo", str(args.tbt_slo), "--admit-ttft-factor", "0", "--port", str(port),
        "--max-model-len", str(args.max_model_len), "--prefill-kv-fraction", str(PREFILL_KV_FRACTION),
        "--step-log", str(step_log), "--quantization", getattr(args, "quantization", "auto"),
    ]  # fmt: skip


def cluster_state(url: str) -> dict:
    """The server's /v1/admin/cluster: its clock, workers' roles, FluidRole transitions."""
    with urllib.request.urlopen(url + "/v1/admin/cluster", timeout=10) as r:
        return json.loads(r.read())


def host_cpu() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of this host's CPUs so far (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[0] + v[1] + v[2] + v[5] + v[6], v[7], sum(v)


def real_run(trace: Trace, calibration: Trace, name: str, policy: str, port: int, args, step_log: Path) -> dict:
    """The trace through a fresh server (its steps logged to `step_log`) after `calibration` through
    the same server: the client's results, the step-log lines of the calibration, the role
    transitions during the run and the prefill workers it started with."""
    url = f"http://127.0.0.1:{port}"
    slo = Slo(args.ttft_slo, args.tbt_slo)
    log_path = Path(tempfile.gettempdir()) / f"fluidpd-fidelity-{Path(name).name}-{policy}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_cmd(policy, port, args, step_log), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            asyncio.run(run_bench(BenchConfig(url=url, trace=calibration, slo=slo, trace_name=name, progress=False)))
            calibration_steps = len(read_step_log(str(step_log)))
            before = cluster_state(url)
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
            first = min(r.send_s for r in results if not np.isnan(r.send_s))
            t0 = before["now_s"] + first  # the client's first send, on the server's clock
            moves = [t for t in cluster_state(url).get("transitions", []) if t["began_s"] >= before["now_s"]]
            return {
                "results": results,
                "calibration_steps": calibration_steps,
                "transitions": [{"at_s": t["began_s"] - t0, "to": t["to"], "total_s": t["total_s"]} for t in moves],
                "prefill_workers": sum(w["role"] == "prefill" for w in before["workers"]),
                "profile": before.get("profile"),  # what the server measured of this host at startup
            }
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


def setup_of(args, scales: dict | None = None, prefill_workers: int | None = None) -> Setup:
    """The simulator's setup of a run: its workers, SLOs, KV share, starting split, step scales."""
    split = args.prefill_workers if prefill_workers is None else prefill_workers
    return host_setup(args.workers, Slo(args.ttft_slo, args.tbt_slo), scales, split, PREFILL_KV_FRACTION)


def sim_run(trace: Trace, policy: str, setup: Setup):
    """The simulator's metrics of `trace` and its FluidRole transitions (as the real run's)."""
    result = simulate(trace, policy, setup)
    moves = getattr(result.cluster.policy, "transitions", [])
    return result.cluster.metrics, [
        {"at_s": t.began_s, "to": t.dst_role.value, "total_s": t.total_s if t.done else None} for t in moves
    ]


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


def calibrated(case: dict, args) -> tuple[dict, list]:
    """The step scales that fit a run's calibration-window steps, and the run's evaluated steps."""
    n = case["calibration_steps"]
    scales = speed_level(case["steps"][:n], setup_of(args, prefill_workers=case["prefill_workers"]))
    return scales, case["steps"][n:]


def measure_cases(args):
    """Each trace x policy through a fresh server; yields what the simulator needs of the run
    (and saves it in --out: client results, step log, calibration, transitions)."""
    port = 8150
    for spec in args.traces:
        window, rate = Window.parse(spec, args.duration)
        name, trace = window.name, window.at(rate, args.max_requests)
        # served first to calibrate: `--calibrate-s` of the trace right after the window, same rate
        calibration = window.after(args.calibrate_s * rate).at(rate, args.max_requests)
        for policy in args.policies:
            port += 1
            print(
                f"{name} / {policy}: {len(calibration)} requests to calibrate, then {len(trace)} through the server",
                file=sys.stderr,
                flush=True,
            )
            step_log = args.out / f"steps_{name}_{policy}.jsonl"
            time.sleep(5)  # the previous server's processes are gone
            run = real_run(trace, calibration, name, policy, port, args, step_log)
            case = {"trace": spec, "policy": policy} | {k: v for k, v in run.items() if k != "results"}
            (args.out / f"real_{name}_{policy}.json").write_text(
                json.dumps(case | {"results": [asdict(r) for r in run["results"]]}) + "\n"
            )
            yield case | {"results": run["results"], "steps": read_step_log(str(step_log))}


def load_cases(args, out: Path) -> list[dict]:
    """The runs `measure_cases` saved in `out`, for re-simulating them after a model change."""
    cases = []
    for spec in args.traces:
        name = Window.parse(spec, args.duration)[0].name
        for policy in args.policies:
            saved = json.loads((out / f"real_{name}_{policy}.json").read_text())
            saved["results"] = [BenchResult(**r) for r in saved["results"]]
            saved["steps"] = read_step_log(str(out / f"steps_{name}_{policy}.jsonl"))
            cases.append(saved)
    return cases


def evaluate(case: dict, args, baseline: dict | None = None) -> dict:
    """One run's row: real stats; the simulator's calibrated on the calibration window's steps, as
    shipped, and at the evaluated run's own speed level (an oracle); the per-step check of the
    evaluated steps; the real stats of `baseline` (the same case run before); CDF overlays (PNG)."""
    spec, policy, results = case["trace"], case["policy"], case["results"]
    name = Window.parse(spec, args.duration)[0].name
    slo = Slo(args.ttft_slo, args.tbt_slo)
    split = case["prefill_workers"]
    scales, steps_log = calibrated(case, args)
    steps = step_check(steps_log, setup_of(args, scales, split))
    print(f"{spec} / {policy}: calibrated step scales {scales} ({case['calibration_steps']} steps)", file=sys.stderr)
    for kind, c in steps.items():
        line = " ".join(f"{k} {v:.3g}" for k, v in c.items()) if isinstance(c, dict) else f"{c:.3g}"
        print(f"  {kind:8} {line}", file=sys.stderr, flush=True)
    real_mc, sent, n = collect(results, slo), sent_trace(results, name), len(results)
    sim_mc, sim_tr = sim_run(sent, policy, setup_of(args, scales, split))
    raw_mc, _ = sim_run(sent, policy, setup_of(args, None, split))
    speed = speed_level(steps_log, setup_of(args, prefill_workers=split))
    oracle_mc, _ = sim_run(sent, policy, setup_of(args, speed, split))
    tag = f"{name}_{policy}"
    real_ttft = np.frombuffer(real_mc.ttft, dtype=np.float64)
    sim_ttft = np.frombuffer(sim_mc.ttft, dtype=np.float64)
    cdf_plot({"real": sorted_cdf(real_ttft), "sim": sorted_cdf(sim_ttft)}, "TTFT (s)",
             args.out / f"ttft_cdf_{tag}.png", args.ttft_slo)  # fmt: skip
    cdf_plot({"real": real_mc.tbt.cdf_points(), "sim": sim_mc.tbt.cdf_points()}, "time between tokens (s)",
             args.out / f"tbt_cdf_{tag}.png", args.tbt_slo)  # fmt: skip
    sims = {"sim": stats(sim_mc, n), "sim_uncalibrated": stats(raw_mc, n), "sim_oracle_speed": stats(oracle_mc, n)}
    if baseline is not None:
        sims["real_before"] = stats(collect(baseline["results"], slo), len(baseline["results"]))
    transitions_ = {"real": case["transitions"], "sim": sim_tr}
    return {"trace": spec, "policy": policy, "requests": n, "real": stats(real_mc, n), **sims, "scales": scales,
            "run_speed": speed, "transitions": transitions_, "steps": steps}  # fmt: skip


def add_calibrate_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--calibrate-s", type=float, default=10.0, help="seconds of trace served to calibrate first")


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
    add_calibrate_flag(ap)
    ap.add_argument("--resim", action="store_true", help="re-simulate the real runs saved in --out (no server)")
    ap.add_argument("--baseline", type=Path, help="an earlier --out: its real runs against these (run to run)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = load_cases(args, args.out) if args.resim else list(measure_cases(args))
    before = {(c["trace"], c["policy"]): c for c in load_cases(args, args.baseline)} if args.baseline else {}
    rows = [evaluate(c, args, before.get((c["trace"], c["policy"]))) for c in cases]
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    keys = ("ttft_mean", "ttft_p50", "ttft_p99", "tbt_mean", "tbt_p50", "tbt_p99", "throughput")
    print(f"{'trace':20} {'policy':9} " + " ".join(f"{k:>10}" for k in keys) + "  attain real/sim  transitions r/s")
    for r in rows:
        err = errors(r["real"], r["sim"], keys)
        print(
            f"{r['trace']:20} {r['policy']:9} "
            + " ".join(f"{err[k]:+10.1%}" for k in keys)
            + f"  {r['real']['attainment']:.1%}/{r['sim']['attainment']:.1%}"
            f"  {len(r['transitions']['real'])}/{len(r['transitions']['sim'])}"
        )
        for side in ("real", "sim"):
            for t in r["transitions"][side]:
                took = f"{t['total_s'] * 1e3:.0f} ms" if t["total_s"] is not None else "unfinished"
                print(f"    {side:4} FluidRole to {t['to']} at {t['at_s']:.1f} s, took {took}")
    print(f"rows and CDF overlays in {args.out}{os.sep}")
    mean, p99, gap = worst(rows, "sim", keys)
    for side, label in (
        ("sim_uncalibrated", "uncalibrated (the profile as shipped)"),
        ("sim_oracle_speed", "oracle, at each run's own speed level (read off its step log)"),
        ("real_before", f"the real runs in {args.baseline} against these (run to run)"),
    ):
        if side in rows[0]:
            w = worst(rows, side, keys)
            print(f"{label}: worst mean error {w[0]:.1%}, worst p99 error {w[1]:.1%}, attainment gap {w[2]:.1f} pp")
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
