"""The seed's Table 1 on the real engine: static-pd, chunked and fluidpd through the real server on
the bursty Azure code trace at `make run`'s SLOs (RuntimeConfig's defaults), at a load set from this
host's measured capacity, with the simulator's prediction of the same table beside it.

The load (`fluidpd.bench.capacity`): the requests are a fixed window of the trace (`--trace
NAME:RATE@START` with `--duration`, on the RATE-scaled clock: the same requests on every host).
This host is measured as `fluidpd serve` measures it at startup (a 512-token prefill, a decode step);
the window then replays at `--share` (1.0) of the saturation rate: the highest rate at which
static-pd at its best split keeps >= 90% joint attainment on the history window (the requests just
before), simulated at this host's speed. `--rate X` replays at a fixed rate instead (before
2026-12-04 the default was 0.1: a fixed load that overloads a slower host). static-pd and fluidpd
start from static-pd's best split on the history window at that rate (`--prefill-workers` fixes it).

For each policy: start `fluidpd serve` (SmolLM2, 4 worker processes, admission off so every system
sees every request), serve a calibration window (the trace right after the evaluated one), replay
the window with the `fluidpd bench` client (open loop, streaming: TTFT and every gap measured at the
client), stop the server; then simulate the requests the client sent on this host's profile
(`--gpu cpu-host`), same policy, SLOs and workers, at the step scales that fit the calibration
window (as `sim_fidelity.py` does). Prints the rate, the host's speeds, then joint and strict
attainment, P99 TTFT and P99 TBT (over all gaps), real and simulated; writes the rows (JSON) and
bar plots (PNG); the headline is the last line.

    cd benchmarks && ../.venv/bin/python runtime_table1.py [--share 1.0 | --rate 0.1] [--trace azure_code:0.1@9100]
        [--phase-shift-s 20]

--phase-shift-s S: the seed's shifting regime (a prompt surge, then a generation wave, S seconds each
of the trace's clock, `fluidpd.workload.synth.phase_shift`), the window its fifth cycle, history its fourth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulation"))  # sim_fidelity
from sim_fidelity import add_calibrate_flag, calibrated, real_run, sent_trace, setup_of, sim_run

from fluidpd.bench.capacity import HostSpeed, Window, best_split, load_for
from fluidpd.bench.loadgen.aggregate import collect
from fluidpd.bench.plots import bars_plot
from fluidpd.core.metrics import Slo
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.steplog import read_step_log
from fluidpd.workload.loaders import SIMPLE_COLUMNS
from fluidpd.workload.synth import phase_shift

SYSTEMS = ("chunked", "static-pd", "fluidpd")


def row(summary: dict) -> dict:
    keys = ("attainment", "strict_attainment", "ttft_p99_s", "tbt_p99_s", "completed", "throughput_tok_s")
    return {k: summary[k] for k in keys}


def phase_shift_window(out: Path, phase_s: float, cycles: int = 12) -> tuple[str, float]:
    """`phase_shift` with `cycles` cycles of `phase_s`-second phases as a trace file in `out`, and
    the window (NAME:1@START) and duration of its fifth cycle (the fourth is its history)."""
    trace = phase_shift(phase_s, cycles=cycles, seed=0)
    path = out / "phase_shift.csv"
    rows = zip(trace.arrival_s, trace.prompt_len, trace.output_len)
    header = ",".join(SIMPLE_COLUMNS)  # the columns the trace-file loader reads
    path.write_text(header + "\n" + "".join(f"{a:.6f},{p},{o}\n" for a, p, o in rows))
    return f"{path}:1@{8 * phase_s:g}", 2 * phase_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure_code:0.1@9100", help="NAME:RATE@START: the window's requests")
    ap.add_argument("--duration", type=float, default=150.0, help="the window, seconds of the RATE-scaled clock")
    ap.add_argument(
        "--phase-shift-s",
        type=float,
        default=0.0,
        help="the shifting regime instead of --trace: FluidPD's phase_shift (a prompt surge, then a generation "
        "wave, this many seconds each; 12 cycles written to --out), the window its fifth cycle",
    )
    ap.add_argument("--share", type=float, default=1.0, help="replay at this share of the host's saturation rate")
    ap.add_argument("--rate", type=float, default=None, help="replay at this fixed rate scale instead")
    ap.add_argument("--max-requests", type=int, default=300)
    ap.add_argument("--max-model-len", type=int, default=512, help="prompt + output clipped to this (both sides)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefill-workers", type=int, default=0, help="starting split (0: static-pd's best on history)")
    ap.add_argument("--policies", nargs="+", default=list(SYSTEMS))
    ap.add_argument("--quantization", default="auto", help="the servers' weight format (a slower or faster engine)")
    ap.add_argument("--out", type=Path, default=Path("results/runtime_table1"))
    add_calibrate_flag(ap)
    args = ap.parse_args()
    defaults = RuntimeConfig()
    args.ttft_slo, args.tbt_slo = defaults.ttft_slo_s, defaults.tbt_slo_s
    slo = Slo(args.ttft_slo, args.tbt_slo)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase_shift_s:
        args.trace, args.duration = phase_shift_window(args.out, args.phase_shift_s)
    window, reference_rate = Window.parse(args.trace, args.duration)
    clip = {"max_requests": args.max_requests, "max_model_len": args.max_model_len}
    print("measuring this host as `fluidpd serve` does at startup ...", file=sys.stderr, flush=True)
    speed = HostSpeed.measure(args.workers, slo, args.quantization)
    load = load_for(window, args.workers, slo, speed, reference_rate, args.share, args.rate, **clip)
    args.prefill_workers = args.prefill_workers or best_split(window, load.rate, args.workers, slo, speed, **clip)
    print(f"host: {speed.describe()}\nload: {load.describe()}", file=sys.stderr, flush=True)
    trace = window.at(load.rate, args.max_requests)
    calibration = window.after(args.calibrate_s * load.rate).at(load.rate, args.max_requests)
    rows = {}
    for i, policy in enumerate(args.policies):
        print(f"{policy}: {len(trace)} requests of {window.spec(load.rate)} through the server ...", file=sys.stderr)
        step_log = args.out / f"steps_{policy}.jsonl"
        run = real_run(trace, calibration, window.name, policy, 8250 + i, args, step_log)
        scales, _ = calibrated(run | {"steps": read_step_log(str(step_log))}, args)
        setup = setup_of(args, scales, run["prefill_workers"])
        sim_mc, sim_tr = sim_run(sent_trace(run["results"], window.name), policy, setup)
        real_mc, n = collect(run["results"], slo), len(run["results"])
        rows[policy] = {
            "requests": n,
            "scales": scales,
            "server_profile": run["profile"],
            "real": row(real_mc.summary(n)) | {"transitions": run["transitions"]},
            "sim": row(sim_mc.summary(n)) | {"transitions": sim_tr},
        }
    setting = {"trace": window.spec(load.rate), "window": asdict(window), "duration_s": window.span_s / load.rate,
               "slo": [args.ttft_slo, args.tbt_slo], "workers": args.workers, "prefill_workers": args.prefill_workers,
               "max_model_len": args.max_model_len, "quantization": args.quantization, "load": load.as_json(),
               "host": speed.as_json(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    (args.out / "table1.json").write_text(json.dumps({"setting": setting, "rows": rows}, indent=1) + "\n")
    title = f"{window.spec(load.rate)}, SLO {args.ttft_slo:g} s / {args.tbt_slo:g} s"
    for metric, label in (("attainment", "joint SLO attainment"), ("ttft_p99_s", "P99 TTFT (s)")):
        groups = {p: {"real": r["real"][metric], "sim": r["sim"][metric]} for p, r in rows.items()}
        bars_plot(groups, label, args.out / f"{metric}.png", title)
    print(
        f"Table 1 on the real engine: {window.spec(load.rate)} ({len(trace)} requests over "
        f"{window.span_s / load.rate:.0f} s), SLO TTFT {args.ttft_slo:g} s / TBT {args.tbt_slo:g} s, {args.workers} "
        f"workers, P/D systems from {args.prefill_workers}P{args.workers - args.prefill_workers}D; sim = the profiled "
        f"simulator on the same requests\nhost: {speed.describe()}\nload: {load.describe()}"
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
        f"table1 at rate {load.rate:.4g} ({'fixed' if load.share is None else f'{load.share:g} x saturation'}; "
        f"host prefill {speed.prefill_tok_s:.0f} tok/s, decode step {speed.decode_step_s * 1e3:.0f} ms): joint "
        "attainment real/sim "
        + ", ".join(f"{p} {r['real']['attainment']:.1%}/{r['sim']['attainment']:.1%}" for p, r in rows.items())
        + "; strict "
        + ", ".join(f"{p} {r['real']['strict_attainment']:.1%}" for p, r in rows.items())
        + "; P99 TTFT "
        + ", ".join(f"{p} {r['real']['ttft_p99_s']:.2f}/{r['sim']['ttft_p99_s']:.2f} s" for p, r in rows.items())
    )


if __name__ == "__main__":
    main()
