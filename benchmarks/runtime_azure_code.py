"""The bursty Azure code trace through the real server: static-pd vs fluidpd, side by side.

For each policy: start `fluidpd serve` (SmolLM2, 4 worker processes, 1 prefill worker to start),
replay the Azure code trace rate-scaled to what this 2-core machine serves with `fluidpd bench`
(streaming API, client-side TTFT and gaps), stop the server. Prints attainment, P99 TTFT and P99
TBT per policy, and the headline on the last line.

    .venv/bin/python benchmarks/runtime_azure_code.py [--rate-scale 0.03] [--duration 240]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

SLO = ("--ttft-slo", "10", "--tbt-slo", "0.6")
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


def run_policy(policy: str, port: int, args) -> dict:
    url = f"http://127.0.0.1:{port}"
    serve = [
        sys.executable,
        "-m",
        "fluidpd.cli",
        "serve",
        "--model",
        "smollm2",
        "--workers",
        "4",
        "--prefill-workers",
        "1",
        "--policy",
        policy,
        *SLO,
        *ADMIT_ALL,
        "--port",
        str(port),
        "--max-model-len",
        str(args.max_model_len),
    ]
    with open(os.path.join(tempfile.gettempdir(), f"fluidpd-serve-{policy}.log"), "w") as log:
        proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            out = os.path.join(tempfile.gettempdir(), f"fluidpd-bench-{policy}.json")
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "fluidpd.cli",
                    "bench",
                    "--url",
                    url,
                    "--trace",
                    "azure_code",
                    "--rate-scale",
                    str(args.rate_scale),
                    "--duration",
                    str(args.duration),
                    *SLO,
                    "--out",
                    out,
                    "--no-progress",
                ],
                check=True,
            )
            with open(out) as f:
                row = json.load(f)
            return row[0] if isinstance(row, list) else row
        finally:
            stop_server(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-scale", type=float, default=0.03)
    ap.add_argument("--duration", type=float, default=240)
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args()
    rows = {}
    for i, policy in enumerate(("static-pd", "fluidpd")):
        rows[policy] = run_policy(policy, 8100 + i, args)
    for policy, r in rows.items():
        print(
            f"{policy:10s}: {r['completed']}/{r['requests']} done, attainment {r['attainment']:.1%}, "
            f"strict {r['strict_attainment']:.1%}, P99 TTFT {r['ttft_p99_s']:.2f} s, P99 TBT "
            f"{r['tbt_p99_s'] * 1e3:.0f} ms, TPOT {r['tpot_mean_s'] * 1e3:.0f} ms"
        )
    s, f = rows["static-pd"], rows["fluidpd"]
    print(
        f"headline: azure_code x{args.rate_scale} through the server: attainment fluidpd {f['attainment']:.1%} vs "
        f"static-pd {s['attainment']:.1%}; P99 TTFT {f['ttft_p99_s']:.2f} vs {s['ttft_p99_s']:.2f} s; "
        f"P99 TBT {f['tbt_p99_s'] * 1e3:.0f} vs {s['tbt_p99_s'] * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
