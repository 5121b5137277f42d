"""The bursty Azure code trace through the real server: static-pd vs fluidpd, side by side.

The requests are a window of the trace (`--trace NAME:RATE@START`, `--duration` on the RATE-scaled
clock); they replay at `--share` (1.0) of this host's saturation rate (`fluidpd.bench.capacity`: the
host measured as `fluidpd serve` measures it, then the highest rate at which static-pd's best split
keeps >= 90% joint attainment on the history window, simulated at that speed), or at a fixed
`--rate`. For each policy: start `fluidpd serve` (SmolLM2, 4 worker processes, 1 prefill worker to
start), replay the window with the `fluidpd bench` client (streaming API, client-side TTFT and
gaps), stop the server. Prints the rate and the host's speeds, attainment, P99 TTFT and P99 TBT per
policy, and the headline on the last line.

    .venv/bin/python benchmarks/runtime/runtime_azure_code.py [--share 1.0 | --rate 0.03] [--trace azure_code:0.03@1200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from fluidpd.bench.capacity import HostSpeed, Window, load_for
from fluidpd.bench.loadgen.run import BenchConfig, run_bench
from fluidpd.bench.peers.process import SERVE
from fluidpd.core.metrics import Slo

SLO = Slo(10.0, 0.6)
ADMIT_ALL = ("--admit-ttft-factor", "0")  # admission off: every system sees every request


def wait_healthy(url: str, proc, timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise TimeoutError("server did not become healthy")


def stop_server(proc) -> None:
    """Ctrl-C the server (graceful: workers stopped, shared memory freed); kill it after 60 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_policy(policy: str, port: int, trace, args) -> dict:
    url = f"http://127.0.0.1:{port}"
    serve = [
        *SERVE, "--model", "smollm2", "--workers", "4", "--prefill-workers", "1",
        "--policy", policy, "--ttft-slo", str(SLO.ttft_s), "--tbt-slo", str(SLO.tbt_s), *ADMIT_ALL,
        "--port", str(port), "--max-model-len", str(args.max_model_len),
    ]  # fmt: skip
    with open(os.path.join(tempfile.gettempdir(), f"fluidpd-serve-{policy}.log"), "w") as log:
        proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            cfg = BenchConfig(url=url, trace=trace, slo=SLO, trace_name=trace.name, progress=False)
            row, _ = asyncio.run(run_bench(cfg))
            return row
        finally:
            stop_server(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure_code:0.03@1200", help="NAME:RATE@START: the window's requests")
    ap.add_argument("--duration", type=float, default=240)
    ap.add_argument("--share", type=float, default=1.0, help="replay at this share of the host's saturation rate")
    ap.add_argument("--rate", type=float, default=None, help="replay at this fixed rate scale instead")
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args()
    window, reference = Window.parse(args.trace, args.duration)
    speed = HostSpeed.measure(4, SLO)
    load = load_for(window, 4, SLO, speed, reference, args.share, args.rate, max_model_len=args.max_model_len)
    trace = window.at(load.rate)
    print(f"host: {speed.describe()}\nload: {load.describe()}; {len(trace)} requests", file=sys.stderr, flush=True)
    rows = {}
    for i, policy in enumerate(("static-pd", "fluidpd")):
        rows[policy] = run_policy(policy, 8100 + i, trace, args)
    print(f"host: {speed.describe()}\nload: {load.describe()}")
    for policy, r in rows.items():
        print(
            f"{policy:10s}: {r['completed']}/{r['requests']} done, attainment {r['attainment']:.1%}, "
            f"strict {r['strict_attainment']:.1%}, P99 TTFT {r['ttft_p99_s']:.2f} s, P99 TBT "
            f"{r['tbt_p99_s'] * 1e3:.0f} ms, TPOT {r['tpot_mean_s'] * 1e3:.0f} ms"
        )
    s, f = rows["static-pd"], rows["fluidpd"]
    print(
        f"headline: {window.spec(load.rate)} through the server (host prefill {speed.prefill_tok_s:.0f} tok/s): "
        f"attainment fluidpd {f['attainment']:.1%} vs static-pd {s['attainment']:.1%}; P99 TTFT "
        f"{f['ttft_p99_s']:.2f} vs {s['ttft_p99_s']:.2f} s; P99 TBT {f['tbt_p99_s'] * 1e3:.0f} vs "
        f"{s['tbt_p99_s'] * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
