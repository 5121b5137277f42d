"""KV affinity on the real server: `fluidpd serve --workers 4 --policy fluidpd` (routing by predicted
TTFT with KV affinity) against static-pd under the baseline routers, on multi-turn chat sessions.

Each system (named `<policy>+<router>`) gets a fresh 4-worker server (1 prefill + 3 decode to start)
and replays the same generated sessions with `fluidpd bench --sessions chat`'s closed-loop replay
(benchmarks/runtime/prefix_cache.py's helpers: every turn carries the conversation so far and the model's
greedy answers; closed loop, so the load follows the host: its speeds, from the servers' startup
profiles, are printed and recorded). Rounds rotate the systems' order so the host's noise hits them alike. Reported per
system: turn-2+ TTFT p50/p95 (the turns that can reuse their session's history), the hit rate the
server reports over those turns, KV bytes moved between workers per request (hand-offs and
migrations: `fluidpd:kv_transfer_bytes_total` over the requests served, with the moves that fell
back to the whole KV from /v1/admin/cluster), and whether the transcripts equal the first baseline's.
Ratios are against the best static-pd router of the same run (lowest turn-2+ p50). JSON, a per-turn
PNG and the table go to --out; the headline is the last line.

    PYTHONPATH=. .venv/bin/python benchmarks/runtime/runtime_kv_affinity.py [--rounds 1] [--routers R...] [--quick]

--quick (2 baseline routers, 3 sessions x 3 turns over a 300-token system prompt) takes about
10 minutes on a busy 2-core host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from prefix_cache import BLOCK, add_session_args, equality, free_port, summarize, trace_of
from runtime_azure_code import stop_server, wait_healthy

from fluidpd.bench.capacity import HostSpeed
from fluidpd.bench.loadgen.run import BenchConfig
from fluidpd.bench.loadgen.session_run import SessionReplayConfig, run_sessions
from fluidpd.bench.loadgen.turn_plot import turns_plot
from fluidpd.bench.loadgen.turns import by_turn
from fluidpd.bench.peers.process import SERVE
from fluidpd.core.metrics import Slo

FLUIDPD = ("fluidpd", "")  # its own router: kv-affinity
KV_BYTES = "fluidpd:kv_transfer_bytes_total"


def name(system: tuple[str, str]) -> str:
    policy, router = system
    return f"{policy}+{router or 'kv-affinity'}"


def serve_cmd(system: tuple[str, str], port: int, args) -> list[str]:
    policy, router = system
    longest = args.system_tokens + args.turns * (args.new_tokens + args.output_tokens) + 64
    blocks = math.ceil(1.5 * args.sessions * longest / BLOCK)  # every session's context, and room to keep it
    cmd = [*SERVE, "--workers", str(args.workers), "--port", str(port)]
    cmd += ["--policy", policy, "--num-kv-blocks", str(blocks), "--admit-ttft-factor", "0", "--log-level", "warning"]
    cmd += ["--ttft-slo", str(args.ttft_slo), "--tbt-slo", str(args.tbt_slo)]
    return cmd + (["--router", router] if router else [])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def scraped(page: str, metric: str) -> float:
    """`metric`'s samples summed over a /metrics page."""
    return sum(float(x.rsplit(" ", 1)[1]) for x in page.splitlines() if x.startswith((metric + "{", metric + " ")))


def run_one(system: tuple[str, str], args) -> dict:
    """A fresh server, the sessions replayed once, its KV-move counters read, the server stopped."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"runtime_kv_affinity: {name(system)} ...", file=sys.stderr)
    log_path = os.path.join(tempfile.gettempdir(), f"fluidpd-kv-affinity-{name(system)}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_cmd(system, port, args), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            slo = Slo(args.ttft_slo, args.tbt_slo)
            cfg = BenchConfig(url=url, trace=trace_of(args, args.groups), slo=slo, seed=args.seed)
            report = asyncio.run(run_sessions(cfg, SessionReplayConfig(n_sessions=args.sessions)))
            kv_bytes = scraped(get(url + "/metrics"), KV_BYTES)
            state = json.loads(get(url + "/v1/admin/cluster"))
        finally:
            stop_server(proc)
    return {
        "system": name(system),
        "report": report,
        "kv_bytes": kv_bytes,
        "kv_moves": state.get("kv_moves", {}),
        "profile": state.get("profile"),
    }


def row(runs: list[dict], slo: Slo) -> dict:
    served = sum(len(run["report"].results) for run in runs)
    s = summarize(runs) | {"system": runs[0]["system"], "rounds": len(runs)}
    s["kv_bytes_per_request"] = sum(run["kv_bytes"] for run in runs) / max(served, 1)
    s["kv_move_fallbacks"] = sum(run["kv_moves"].get("fallbacks", 0) for run in runs)
    s["by_turn"] = by_turn([t for run in runs for t in run["report"].results], slo)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--routers", nargs="+", default=["shortest-queue", "sglang-cache-aware", "dynamo-kv", "llm-d"])
    ap.add_argument("--groups", type=int, default=2, help="distinct system prompts the sessions share")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over every system, order rotated each round")
    add_session_args(ap)
    ap.add_argument("--quick", action="store_true", help="2 baseline routers, 3 sessions x 3 turns, 300 tokens")
    ap.add_argument("--out", type=Path, default=Path("results/runtime_kv_affinity"))
    args = ap.parse_args()
    if args.quick:
        args.routers = ["shortest-queue", "sglang-cache-aware"]
        args.sessions, args.turns, args.system_tokens = 3, 3, 300
        args.new_tokens, args.output_tokens, args.think_time = 32, 16, 0.5
    if args.rounds < 1 or args.workers < 2:
        ap.error("--rounds must be >= 1 and --workers >= 2")
    systems = [FLUIDPD] + [("static-pd", r) for r in args.routers]
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        k = r % len(systems)
        for system in systems[k:] + systems[:k]:
            runs.setdefault(name(system), []).append(run_one(system, args))
    report([runs[name(s)] for s in systems], args)


def report(by_system: list[list[dict]], args) -> None:
    slo = Slo(args.ttft_slo, args.tbt_slo)
    rows = [row(rs, slo) for rs in by_system]
    ours, baselines = rows[0], rows[1:]
    best = min(baselines, key=lambda s: s["turn2_ttft_p50_s"])
    reference = by_system[1][0]  # transcripts compared with the first baseline's first run
    for s, rs in zip(rows, by_system):
        s["transcripts_vs_" + reference["system"]] = equality(rs[0], reference)
    print(
        f"{'system':30} {'turn-2+ TTFT p50':>17} {'p95':>8} {'vs best':>8} {'hit rate':>9} "
        f"{'KV MB/req':>10} {'fallbacks':>9}  greedy equal"
    )
    for s in rows:
        eq = s["transcripts_vs_" + reference["system"]]
        print(
            f"{s['system']:30} {s['turn2_ttft_p50_s']:16.3f}s {s['turn2_ttft_p95_s']:7.3f}s "
            f"{best['turn2_ttft_p50_s'] / s['turn2_ttft_p50_s']:7.2f}x {s['turn2_hit_rate']:9.1%} "
            f"{s['kv_bytes_per_request'] / 1e6:10.2f} {s['kv_move_fallbacks']:9d}  "
            f"{eq['sessions_equal']}/{eq['sessions']} sessions"
        )
    profiles = [run["profile"] for rs in by_system for run in rs]
    host = HostSpeed.median_of(profiles, args.workers, slo)
    print(f"host (the servers' startup profiles, median of {len(profiles)}): {host.describe()}")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "host": host.as_json(),
        "server_profiles": profiles,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (args.out / "runtime_kv_affinity.json").write_text(json.dumps({**meta, "systems": rows}, indent=2) + "\n")
    series = {s["system"]: s["by_turn"] for s in rows}
    turns_plot(series, args.out / "runtime_kv_affinity.png", f"KV affinity, {args.workers} workers: TTFT and hit rate")
    print(f"wrote {args.out}/runtime_kv_affinity.json and runtime_kv_affinity.png", file=sys.stderr)
    eqs = [s["transcripts_vs_" + reference["system"]] for s in rows]
    equal = all(eq["sessions_equal"] == eq["sessions"] for eq in eqs)
    kv = ours["kv_bytes_per_request"] / best["kv_bytes_per_request"] if best["kv_bytes_per_request"] else math.nan
    print(
        f"turn-2+ p50 TTFT: {ours['system']} {ours['turn2_ttft_p50_s']:.3f} s vs {best['system']} "
        f"{best['turn2_ttft_p50_s']:.3f} s ({best['turn2_ttft_p50_s'] / ours['turn2_ttft_p50_s']:.2f}x); "
        f"hit rate {ours['turn2_hit_rate']:.1%} vs {best['turn2_hit_rate']:.1%}; KV moved per request "
        f"{ours['kv_bytes_per_request'] / 1e6:.2f} vs {best['kv_bytes_per_request'] / 1e6:.2f} MB ({kv:.2f}x); "
        f"transcripts {'equal' if equal else 'DIFFER'} (closed loop; host prefill {host.prefill_tok_s:.0f} tok/s)"
    )


if __name__ == "__main__":
    main()
