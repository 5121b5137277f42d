"""KV beyond the arenas on the real server: the node-shared KV store (--kv-offloading-size) against none.

`fluidpd serve --workers 4 --policy fluidpd` with small arenas (--num-kv-blocks 80, the least that
holds one --max-model-len 1280 request) and chat sessions that each have their own system prompt, so
their working set (every session's context at its last turn) is over 4x the four arenas together.
Three fresh servers replay the same sessions with `fluidpd bench --sessions chat`'s client (closed
loop, the model's greedy answers feeding the next turn):
  1. prefix caching, no store;
  2. prefix caching and the store (GiB per worker, pooled into one file under /dev/shm);
  3. as 2, and a SIGKILL of the worker holding the most cached blocks halfway through (by run 2's wall
     time); its replacement joins while the replay goes on.
Reported: turn-2+ TTFT p50 (target: >= 3x lower with the store), the hit rate of turns 2+, whether
every answer is identical with and without the store (greedy), the simulator's hit rate on each run's
own replay with the same store (as prefix_cache_fidelity.py does; target within 2 points), and for
run 3 the turns lost (target none) and the hit rate of the turns sent after the kill against the same
turns of run 2. JSON and a by-turn PNG go to --out.

    .venv/bin/python benchmarks/runtime/kv_tier.py [--quick | --no-reuse] [--resim]

About 12 minutes on a busy 2-core host; --quick (10 sessions x 4 turns, no kill run) about 5.
--no-reuse: the store's cost where nothing is reused: 40 one-turn sessions, each its own system
prompt (runs 1 and 2 only), TTFT p50 and wall time with the store against without (the store writes
every block and loads none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulation"))  # prefix_cache_fidelity
from prefix_cache import add_session_args, equality, free_port, trace_of
from prefix_cache_fidelity import chat_encoder, cluster_state, evaluate, load_run, run_record, save_run
from runtime_azure_code import stop_server, wait_healthy

from fluidpd.bench.loadgen.run import BenchConfig
from fluidpd.bench.loadgen.session_run import SessionReplayConfig, run_sessions
from fluidpd.bench.loadgen.turn_plot import turns_plot
from fluidpd.bench.loadgen.turns import by_turn, hit_rate, later_turns, ttft_percentile
from fluidpd.bench.peers.process import SERVE
from fluidpd.core.metrics import Slo

BLOCK = 16
ARMS = ("no store", "store", "store, worker killed")


def serve_cmd(port: int, args, store: bool) -> list[str]:
    cmd = [*SERVE, "--workers", str(args.workers), "--port", str(port)]
    cmd += ["--policy", "fluidpd", "--num-kv-blocks", str(args.num_kv_blocks), "--max-model-len", str(args.max_len)]
    cmd += ["--admit-ttft-factor", "0", "--ttft-slo", str(args.ttft_slo), "--tbt-slo", str(args.tbt_slo)]
    cmd += ["--log-level", "info"]
    return cmd + (["--kv-offloading-size", str(args.store_gib)] if store else [])


def kill_busiest(url: str, out: dict) -> None:
    """SIGKILL the worker whose arena caches the most blocks (its sessions' KV lives on only in the store)."""
    workers = cluster_state(url)["workers"]
    w = max(workers, key=lambda w: w["prefix_cache"]["cached_blocks"])
    out.update(worker=w["id"], pid=w["pid"], at_s=time.perf_counter(), cached_blocks=w["prefix_cache"]["cached_blocks"])
    os.kill(w["pid"], signal.SIGKILL)


def real_run(arm: int, args, kill_after_s: float | None) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    name = ARMS[arm].replace(" ", "-").replace(",", "")
    print(f"kv_tier: {ARMS[arm]}: {args.sessions} sessions x {args.turns} turns ...", file=sys.stderr, flush=True)
    log_path = os.path.join(tempfile.gettempdir(), f"fluidpd-kv-tier-{name}.log")
    cmd = serve_cmd(port, args, arm > 0)
    killed: dict = {}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            before = cluster_state(url)
            cfg = BenchConfig(
                url=url, trace=trace_of(args, args.sessions), slo=Slo(args.ttft_slo, args.tbt_slo), seed=args.seed
            )
            timer = threading.Timer(kill_after_s, kill_busiest, (url, killed)) if kill_after_s else None
            t0 = time.perf_counter()
            if timer:
                timer.start()
            report = asyncio.run(run_sessions(cfg, SessionReplayConfig(n_sessions=args.sessions)))
            wall = time.perf_counter() - t0
            if timer:
                timer.cancel()
            after = cluster_state(url)
        finally:
            stop_server(proc)
    if killed:
        killed["at_s"] -= t0
    return run_record(args.workers, args.sessions, args.num_kv_blocks, before, after, log_path, report) | {
        "arm": arm,
        "kv_offloading_size": args.store_gib if arm > 0 else 0.0,
        "kv_store": after.get("kv_store"),
        "losses": after.get("losses", []),
        "killed": killed,
        "wall_s": wall,
    }


def summary(run: dict, fid: dict) -> dict:
    later = later_turns(run["results"]) or [t.result for t in run["results"]]  # one-turn sessions: every turn
    return {
        "arm": ARMS[run["arm"]],
        "turn2_ttft_p50_s": ttft_percentile(later, 50),
        "turn2_ttft_p95_s": ttft_percentile(later, 95),
        "turn2_hit_rate": hit_rate(later),
        "turn2_ttft_s": sorted(r.token_s[0] - r.send_s for r in later if r.ok),  # the CDF `make figures` draws
        "failed_turns": sum(not t.result.ok for t in run["results"]),
        "turns": len(run["results"]),
        "real_hit_rate": fid["real_hit_rate"],
        "sim_hit_rate": fid["sim_hit_rate"],
        "oracle_hit_rate": fid["oracle_hit_rate"],
        "store": run.get("kv_store"),
        "losses": len(run.get("losses") or []),
        "wall_s": run["wall_s"],
    }


def after_kill(killed_run: dict, store_run: dict) -> dict:
    """Turn-2+ hit rate of the turns sent after the kill, and of the same (session, turn)s in the store run."""
    at = killed_run["killed"].get("at_s", math.inf)
    keys = {(t.session, t.turn) for t in killed_run["results"] if t.turn > 0 and t.result.send_s >= at}

    def pick(run: dict) -> list:
        return [t.result for t in run["results"] if (t.session, t.turn) in keys]

    return {
        "turns": len(keys),
        "hit_rate": hit_rate(pick(killed_run)),
        "same_turns_store_run": hit_rate(pick(store_run)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_session_args(ap)
    ap.set_defaults(sessions=20, turns=5, system_tokens=600, new_tokens=64, output_tokens=32, think_time=1.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--num-kv-blocks", type=int, default=80, help="each worker's arena, in 16-token blocks")
    ap.add_argument("--max-len", type=int, default=1280, help="--max-model-len")
    ap.add_argument("--store-gib", type=float, default=0.5, help="--kv-offloading-size: GiB per worker, pooled")
    ap.add_argument("--quick", action="store_true", help="10 sessions x 4 turns, no kill run")
    ap.add_argument("--no-reuse", action="store_true", help="40 one-turn sessions: the store's cost alone")
    ap.add_argument("--resim", action="store_true", help="re-simulate the runs saved in --out (no server)")
    ap.add_argument("--out", type=Path, default=Path("results/kv_tier"))
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.turns = 10, 4
    if args.no_reuse:
        args.sessions, args.turns, args.quick = 40, 1, True
        args.out = args.out.with_name(args.out.name + "_no_reuse")
    args.out.mkdir(parents=True, exist_ok=True)
    context = args.system_tokens + args.turns * (args.new_tokens + args.output_tokens)
    ratio = args.sessions * context / (args.workers * args.num_kv_blocks * BLOCK)
    print(f"kv_tier: working set ~{args.sessions * context} tokens = {ratio:.1f}x the arenas", file=sys.stderr)
    encode = chat_encoder()
    runs = []
    for arm in range(2 if args.quick else 3):
        path = args.out / f"real_{arm}.json"
        if args.resim:
            runs.append(load_run(path))
            continue
        kill = runs[1]["wall_s"] / 2 if arm == 2 else None
        runs.append(real_run(arm, args, kill))
        save_run(runs[-1], path)
    report(runs, [evaluate(r, encode, args) for r in runs], args, ratio)


def report(runs: list[dict], fids: list[dict], args, ratio: float) -> None:
    rows = [summary(r, f) for r, f in zip(runs, fids)]
    eq = equality(*({"report": SimpleNamespace(results=r["results"])} for r in runs[1::-1]))
    killed = after_kill(runs[2], runs[1]) if len(runs) > 2 else None
    speedup = rows[0]["turn2_ttft_p50_s"] / rows[1]["turn2_ttft_p50_s"]
    slo = Slo(args.ttft_slo, args.tbt_slo)
    series = {ARMS[r["arm"]]: by_turn(r["results"], slo) for r in runs}
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out = {"args": meta, "working_set_x_arenas": ratio, "rows": rows, "greedy_equal": eq, "after_kill": killed}
    out["fidelity"] = [{k: v for k, v in f.items() if k not in ("by_turn",)} for f in fids]
    (args.out / "kv_tier.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    turns_plot(series, args.out / "kv_tier.png", "node-shared KV store vs none: TTFT and hit rate by turn")
    print(f"working set {ratio:.1f}x the {args.workers} arenas ({args.num_kv_blocks} blocks each)")
    print(f"{'run':22} {'turn-2+ p50':>11} {'p95':>8} {'hit':>7} {'sim':>7} {'oracle':>7} {'failed':>7} {'lost':>5}")
    for r in rows:
        print(
            f"{r['arm']:22} {r['turn2_ttft_p50_s']:10.3f}s {r['turn2_ttft_p95_s']:7.3f}s {r['real_hit_rate']:7.1%} "
            f"{r['sim_hit_rate']:7.1%} {r['oracle_hit_rate']:7.1%} {r['failed_turns']:7d} {r['losses']:5d}"
        )
        if r["store"]:
            s = r["store"]
            print(
                f"    store: {s['used_blocks']}/{s['capacity_blocks']} blocks, {s['loaded_blocks']} loaded "
                f"({s['load_s']:.2f} s), {s['offloaded_blocks']} written ({s['offload_s']:.2f} s), "
                f"{s['evicted_blocks']} evicted, {s['checksum_failures']} checksum failures"
            )
    print(f"greedy answers equal with and without the store: {eq['sessions_equal']}/{eq['sessions']} sessions")
    if killed is not None:
        k = runs[2]["killed"]
        print(
            f"killed worker {k.get('worker')} at {k.get('at_s', math.nan):.0f} s ({k.get('cached_blocks')} cached "
            f"blocks): {killed['turns']} later turns hit {killed['hit_rate']:.1%} (the same turns, no kill: "
            f"{killed['same_turns_store_run']:.1%}); {rows[2]['failed_turns']} turns failed"
        )
    gap = max(abs(r["sim_hit_rate"] - r["real_hit_rate"]) for r in rows[1:])
    print(
        f"simulator vs server hit rate: no store {rows[0]['sim_hit_rate']:.1%} vs {rows[0]['real_hit_rate']:.1%}, "
        + ", ".join(f"{r['arm']} {r['sim_hit_rate']:.1%} vs {r['real_hit_rate']:.1%}" for r in rows[1:])
    )
    print(f"wrote {args.out}/kv_tier.json and .png", file=sys.stderr)
    if args.turns == 1:
        print(
            f"no reuse: TTFT p50 {rows[0]['turn2_ttft_p50_s']:.2f} s without the store, "
            f"{rows[1]['turn2_ttft_p50_s']:.2f} s with it ({1 / speedup:.2f}x); wall {rows[0]['wall_s']:.0f} s vs "
            f"{rows[1]['wall_s']:.0f} s ({rows[1]['wall_s'] / rows[0]['wall_s']:.2f}x); "
            f"{(rows[1]['store'] or {}).get('offloaded_blocks', 0)} blocks written, "
            f"{(rows[1]['store'] or {}).get('loaded_blocks', 0)} loaded"
        )
        return
    print(
        f"kv store: turn-2+ TTFT p50 {speedup:.1f}x lower (goal 3x), hit {rows[1]['real_hit_rate']:.1%} vs "
        f"{rows[0]['real_hit_rate']:.1%} without, sim within {100 * gap:.1f} points with the store (goal 2), "
        f"greedy equal "
        f"{eq['sessions_equal']}/{eq['sessions']}"
        + (f", {rows[2]['failed_turns']} turns lost to a killed worker" if killed else "")
    )


if __name__ == "__main__":
    main()
