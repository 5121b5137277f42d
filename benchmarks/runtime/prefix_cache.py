"""Prefix caching on the real server: multi-turn chat sessions over a shared system prompt, cache on vs off.

Each configuration (`fluidpd serve --workers 1`, `--workers 4 --policy fluidpd`; each with
`--enable-prefix-caching` and `--no-enable-prefix-caching`) gets a fresh server; rounds interleave
the cache on and off (the order alternating round by round), so the host's noise hits both alike.
Each run replays the same generated sessions with `fluidpd bench --sessions chat`'s replay (closed
loop: every turn carries the conversation so far and the model's actual greedy answers, sent its think
time after the previous answer). Reported per configuration: turn-2+ TTFT p50/p95 (the turns that can
reuse their session's history), the hit rate the server reports (cached_tokens / prompt_tokens over
turns 2+), output tokens/s, and whether the transcripts (every answer, each feeding the next turn) are
equal with the cache on and off, and this host's speeds (the servers' startup profiles: the load
is a closed loop, each turn sent after the last answer, so it follows the host and is not scaled
to it). JSON, a per-turn PNG and the table go to --out. Target: turn-2+ p50
TTFT at least 3x lower with the cache, one worker.

    .venv/bin/python benchmarks/runtime/prefix_cache.py [--rounds 1] [--workers 1 4] [--quick]

The default run takes about 15 minutes on a busy 2-core host (the cache-off runs prefill every
turn's whole history); --quick (1 worker, 2 sessions x 3 turns) about 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_azure_code import stop_server, wait_healthy

from fluidpd.bench.capacity import HostSpeed, server_profile
from fluidpd.bench.loadgen.run import BenchConfig
from fluidpd.bench.loadgen.session_run import SessionReplayConfig, run_sessions
from fluidpd.bench.loadgen.turn_plot import turns_plot
from fluidpd.bench.loadgen.turns import by_turn, hit_rate, later_turns, ttft_percentile
from fluidpd.bench.peers.process import SERVE
from fluidpd.core.metrics import Slo
from fluidpd.workload.sessions import chat_sessions

CACHE_FLAG = {True: "--enable-prefix-caching", False: "--no-enable-prefix-caching"}
BLOCK = 16  # tokens per KV block (the engine's default)


def cache_flag_supported() -> bool:
    """Whether this checkout's `fluidpd serve` takes --enable-prefix-caching."""
    out = subprocess.run([sys.executable, "-m", "fluidpd.cli", "serve", "--help"], capture_output=True, text=True)
    return CACHE_FLAG[True] in out.stdout


def serve_cmd(workers: int, cache: bool, port: int, args, flag_ok: bool) -> list[str]:
    longest = args.system_tokens + args.turns * (args.new_tokens + args.output_tokens) + 64
    blocks = math.ceil(1.5 * args.sessions * longest / BLOCK)  # every session's context, and room to keep it
    cmd = [*SERVE, "--workers", str(workers), "--port", str(port)]
    cmd += ["--num-kv-blocks", str(blocks), "--admit-ttft-factor", "0", "--log-level", "warning"]
    cmd += ["--ttft-slo", str(args.ttft_slo), "--tbt-slo", str(args.tbt_slo)]
    if workers > 1:
        cmd += ["--policy", "fluidpd"]
    return cmd + ([CACHE_FLAG[cache]] if flag_ok else [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(workers: int, cache: bool, args, flag_ok: bool) -> dict:
    """A fresh server, the sessions replayed once, the server stopped."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    name = f"w{workers}-{'on' if cache else 'off'}"
    print(f"prefix_cache: {name} ...", file=sys.stderr)
    log_path = os.path.join(tempfile.gettempdir(), f"fluidpd-prefix-cache-{name}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_cmd(workers, cache, port, args, flag_ok), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            profile = server_profile(url)
            trace = trace_of(args)
            cfg = BenchConfig(url=url, trace=trace, slo=Slo(args.ttft_slo, args.tbt_slo), seed=args.seed)
            report = asyncio.run(run_sessions(cfg, SessionReplayConfig(n_sessions=args.sessions)))
        finally:
            stop_server(proc)
    return {"workers": workers, "cache": cache, "report": report, "profile": profile}


def trace_of(args, groups: int = 1):
    """The chat sessions the arguments describe (`groups` distinct system prompts)."""
    return chat_sessions(
        args.sessions,
        args.turns,
        args.system_tokens,
        args.new_tokens,
        args.output_tokens,
        args.think_time,
        groups=groups,
        seed=args.seed,
    )


def transcripts(run: dict) -> dict[int, list[str | None]]:
    """Each session's answers in turn order (None: the turn failed)."""
    out: dict[int, list[str | None]] = {}
    for r in run["report"].results:
        out.setdefault(r.session, []).append(r.answer if r.result.ok else None)
    return out


def equality(a: dict, b: dict) -> dict:
    """Sessions whose transcripts are identical, and turns equal before each session's first difference."""
    ta, tb = transcripts(a), transcripts(b)
    same_sessions = sum(ta[s] == tb.get(s) for s in ta)
    equal_turns = 0
    for s, answers in ta.items():
        for x, y in zip(answers, tb.get(s, [])):
            if x is None or x != y:
                break
            equal_turns += 1
    return {"sessions_equal": same_sessions, "sessions": len(ta), "turns_equal_before_divergence": equal_turns,
            "turns": sum(len(v) for v in ta.values())}  # fmt: skip


def summarize(runs: list[dict]) -> dict:
    """Turn-2+ TTFT and hit rate over every round of one configuration; tok/s the median of its rounds."""
    later = [r for run in runs for r in later_turns(run["report"].results)]
    return {
        "turn2_ttft_p50_s": ttft_percentile(later, 50),
        "turn2_ttft_p95_s": ttft_percentile(later, 95),
        "turn2_hit_rate": hit_rate(later),
        "output_tok_s": statistics.median(run["report"].row["throughput_tok_s"] for run in runs),
        "failed": sum(run["report"].row["failed"] for run in runs),
    }


def add_session_args(ap: argparse.ArgumentParser) -> None:
    """The chat sessions' shape and the SLOs (this benchmark's and prefix_cache_fidelity.py's)."""
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--think-time", type=float, default=1.0)
    ap.add_argument("--ttft-slo", type=float, default=5.0)
    ap.add_argument("--tbt-slo", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 4], help="worker counts (>1 runs --policy fluidpd)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of cache off/on per worker count")
    add_session_args(ap)
    ap.add_argument("--quick", action="store_true", help="smoke check: 1 worker, 2 sessions x 3 turns, 300 tokens")
    ap.add_argument("--out", type=Path, default=Path("results/prefix_cache"))
    args = ap.parse_args()
    if args.quick:
        args.workers, args.sessions, args.turns, args.system_tokens = [1], 2, 3, 300
        args.new_tokens, args.output_tokens, args.think_time = 32, 16, 0.5
    if args.rounds < 1 or min(args.workers) < 1:
        ap.error("--rounds and --workers must be >= 1")
    flag_ok = cache_flag_supported()
    if not flag_ok:
        print("prefix_cache: serve takes no --enable-prefix-caching yet: both arms run its default", file=sys.stderr)
    slo = Slo(args.ttft_slo, args.tbt_slo)
    runs: dict[tuple[int, bool], list[dict]] = {}
    for r in range(args.rounds):
        for w in args.workers:
            for cache in (False, True) if r % 2 == 0 else (True, False):
                runs.setdefault((w, cache), []).append(run_one(w, cache, args, flag_ok))
    report(runs, args, slo, flag_ok)


def report(runs: dict[tuple[int, bool], list[dict]], args, slo: Slo, flag_ok: bool) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    rows, series = [], {}
    for (w, cache), rs in sorted(runs.items()):
        label = f"{w} worker{'s' if w > 1 else ''}, cache {'on' if cache else 'off'}"
        every = [t for run in rs for t in run["report"].results]
        s = summarize(rs) | {"config": label, "workers": w, "cache": cache, "rounds": len(rs)}
        s["by_turn"] = by_turn(every, slo)
        series[label] = s["by_turn"]
        if cache and (w, False) in runs:
            s["transcripts_vs_off"] = equality(rs[0], runs[(w, False)][0])
        rows.append(s)
    print(f"{'configuration':26} {'turn-2+ TTFT p50':>17} {'p95':>8} {'hit rate':>9} {'out tok/s':>10}  greedy equal")
    for s in rows:
        eq = s.get("transcripts_vs_off")
        eq_text = f"{eq['sessions_equal']}/{eq['sessions']} sessions" if eq else ""
        print(
            f"{s['config']:26} {s['turn2_ttft_p50_s']:16.3f}s {s['turn2_ttft_p95_s']:7.3f}s "
            f"{s['turn2_hit_rate']:9.1%} {s['output_tok_s']:10.1f}  {eq_text}"
        )
    profiles = [run["profile"] for rs in runs.values() for run in rs]
    host = HostSpeed.median_of(profiles, max(args.workers), slo)
    print(f"host (the servers' startup profiles, median of {len(profiles)}): {host.describe()}")
    meta = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cache_flag": flag_ok,
        "host": host.as_json(),
        "server_profiles": profiles,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (args.out / "prefix_cache.json").write_text(json.dumps({**meta, "configs": rows}, indent=2, default=float) + "\n")
    turns_plot(series, args.out / "prefix_cache.png", "prefix caching: TTFT and hit rate by turn")
    w1 = min(w for w, _ in runs)
    off, on = (next(s for s in rows if s["workers"] == w1 and s["cache"] is c) for c in (False, True))
    ratio = off["turn2_ttft_p50_s"] / on["turn2_ttft_p50_s"]
    print(f"wrote {args.out}/prefix_cache.json and prefix_cache.png", file=sys.stderr)
    print(
        f"turn-2+ p50 TTFT, {w1} worker{'s' if w1 > 1 else ''}: cache off {off['turn2_ttft_p50_s']:.3f} s, "
        f"on {on['turn2_ttft_p50_s']:.3f} s ({ratio:.2f}x; closed loop, host prefill {host.prefill_tok_s:.0f} tok/s, "
        f"decode step {host.decode_step_s * 1e3:.0f} ms)"
    )


if __name__ == "__main__":
    main()
