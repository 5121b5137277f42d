"""Prefix caching, simulator against the real server on the same session replay: token hit rates.

Per configuration (`fluidpd serve --workers 1`, `--workers 4 --policy fluidpd`; one shared system prompt,
and with `--groups 1 2` also two): a fresh server, cache on, admission off; the chat sessions of
benchmarks/runtime/prefix_cache.py replayed once with `fluidpd bench --sessions chat`'s client (closed loop:
each turn = the conversation so far + the model's actual answers, sent its think time after the previous
answer), every turn's messages and answer token ids kept. Then each turn's prompt is rebuilt as the
server built it (its tokenizer's chat template over the messages sent; the count checked against the
server's usage.prompt_tokens), and the replay becomes a session trace (fluidpd.bench.loadgen.session_trace:
block hashes of prompt + answer at the engine's 16-token blocks, session ids, the client's think times,
its send times). The simulator runs that trace with the server's workers, policy, KV blocks per worker
(read from /v1/admin/cluster), L_m and block size, cache on. Compared: the token hit rate (cached prompt
tokens over prompt tokens) over every turn and over turns 2+, the server's (usage cached_tokens) against
the simulator's; also the coordinator's own World view of the server (/v1/admin/cluster) and the
infinite-cache oracle. Hit rates do not depend on this host's speed, so the target is tight: within 2
points. JSON (every turn: messages, answer ids, usage) and a by-turn PNG go to --out.

    .venv/bin/python benchmarks/simulation/prefix_cache_fidelity.py [--workers 1 4] [--groups 1 2] [--resim]

About 5 minutes on a busy 2-core host with the defaults (8 sessions x 6 turns, 1,000-token system
prompt, 32-token answers); --resim re-simulates the runs saved in --out (no server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # prefix_cache, runtime_azure_code
from prefix_cache import add_session_args, free_port, serve_cmd, trace_of
from runtime_azure_code import stop_server, wait_healthy

from fluidpd.bench.loadgen.closed_loop import TurnResult
from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.bench.loadgen.run import BenchConfig
from fluidpd.bench.loadgen.session_run import SessionReplayConfig, run_sessions
from fluidpd.bench.loadgen.session_trace import ReplayTrace, replay_trace
from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.registry import POLICIES, make_policy
from fluidpd.policy.view import Role
from fluidpd.sim.cluster import SimCluster
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, prefill_saturation_tokens, run_cluster
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model

BLOCK = 16  # the engine's KV block size, and the simulator's
PREFILL_KV_FRACTION = 0.5  # RuntimeConfig's default: a prefill worker's arena share kept for KV


def cluster_state(url: str) -> dict:
    with urllib.request.urlopen(url + "/v1/admin/cluster", timeout=10) as r:
        return json.loads(r.read())


def logged_lm(log_path: str) -> int | None:
    """The L_m the server profiled at start (its log), if it says."""
    m = re.search(r"L_m = (\d+) tokens", Path(log_path).read_text(errors="replace"))
    return int(m.group(1)) if m else None


def real_run(workers: int, groups: int, args) -> dict:
    """A fresh server (cache on), the sessions replayed once, its cluster state before and after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    name = f"w{workers}-g{groups}"
    print(f"prefix_cache_fidelity: {name}: serving {args.sessions} sessions x {args.turns} turns ...", file=sys.stderr)
    log_path = os.path.join(tempfile.gettempdir(), f"fluidpd-prefix-cache-fidelity-{name}.log")
    cmd = serve_cmd(workers, True, port, args, True)
    if args.num_kv_blocks:
        cmd[cmd.index("--num-kv-blocks") + 1] = str(args.num_kv_blocks)
    cmd += ["--log-level", "info"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            before = cluster_state(url)
            cfg = BenchConfig(
                url=url, trace=trace_of(args, groups), slo=Slo(args.ttft_slo, args.tbt_slo), seed=args.seed
            )
            report = asyncio.run(run_sessions(cfg, SessionReplayConfig(n_sessions=args.sessions)))
            after = cluster_state(url)
        finally:
            stop_server(proc)
    return run_record(workers, groups, int(cmd[cmd.index("--num-kv-blocks") + 1]), before, after, log_path, report)


def run_record(workers: int, groups: int, num_kv_blocks: int, before: dict, after: dict, log_path, report) -> dict:
    """What `evaluate` reads of one served replay: the server's setup (its cluster state before the
    replay, its log's L_m), its World's view after, and every turn."""
    return {
        "workers": workers,
        "groups": groups,
        "policy": before["policy"],
        "max_model_len": before["max_model_len"],
        "kv_blocks": [w["kv_blocks_total"] for w in before["workers"]],
        "roles": [w["role"] for w in before["workers"]],
        "prefill_batch_tokens": logged_lm(log_path),
        "num_kv_blocks": num_kv_blocks,
        "world_view": [w["prefix_cache"] for w in after["workers"]],
        "roles_after": [w["role"] for w in after["workers"]],
        "transitions": [t["to"] for t in after.get("transitions", [])],
        "results": report.results,
    }


def save_run(run: dict, path: Path) -> None:
    turns = [asdict(t) for t in run["results"]]
    path.write_text(json.dumps({k: v for k, v in run.items() if k != "results"} | {"turns": turns}) + "\n")


def load_run(path: Path) -> dict:
    saved = json.loads(path.read_text())
    turns = saved.pop("turns")
    saved["results"] = [TurnResult(**(t | {"result": BenchResult(**t["result"])})) for t in turns]
    return saved


def chat_encoder():
    """The server's prompt ids of a chat: SmolLM2's tokenizer and chat template, as `fluidpd serve` loads it."""
    from fluidpd.engine.loaders import smollm2_gguf
    from fluidpd.engine.tokenizer import Tokenizer

    return Tokenizer.load(smollm2_gguf()).encode_chat


def simulate_replay(rt: ReplayTrace, run: dict, args):
    """The replay's trace through the simulator: the server's workers, policy, starting roles, KV blocks,
    L_m, block size and batch limits; cache on; the cpu-host profile's step times."""
    n = run["workers"]
    split = sum(r == "prefill" for r in run["roles"])
    setup = Setup(
        get_model("smollm2-135m", "fp32"),
        get_hardware("cpu-host"),
        Slo(args.ttft_slo, args.tbt_slo),
        sim=SimConfig(
            n_workers=n,
            block_size=BLOCK,
            prefill_kv_fraction=PREFILL_KV_FRACTION,
            enable_prefix_caching=True,
            kv_offloading_size=run.get("kv_offloading_size", 0.0),  # the server's node store, if it had one
            kv_offloading_pooled=True,
        ),
        policy=PolicyConfig(
            prefill_workers=split,
            prefill_batch_tokens=run["prefill_batch_tokens"] or 0,
            max_num_batched_tokens=min(PolicyConfig().max_num_batched_tokens, run["max_model_len"]),
        ),
    )
    roofline = setup.roofline()
    pcfg = setup.policy
    if not pcfg.prefill_batch_tokens:
        pcfg = replace(pcfg, prefill_batch_tokens=prefill_saturation_tokens(roofline))
    name = run["policy"]
    costs = setup.costs(roofline) if POLICIES.get(name).needs_costs else None
    cluster = SimCluster(
        rt.trace,
        make_policy(name, pcfg, setup.fluid, costs),
        roofline.step_time,
        setup.model.kv_bytes_per_token,
        run["num_kv_blocks"],  # the server's arena per worker (the engine's --num-kv-blocks)
        setup.network(),
        MetricsCollector(setup.slo, finished=[]),
        roofline.sim_config(setup.sim),
    )

    def as_served(cl: SimCluster) -> None:
        """Prefill workers start with the runtime's share of their arena (its coordinator's remap)."""
        cl.prefill_kv_floor = -(-run["max_model_len"] // BLOCK)
        for w in cl.workers:
            if w.role is Role.PREFILL:
                w.kv_blocks_total = cl.remap_blocks(w, Role.PREFILL)

    result = run_cluster(cluster, name, before_run=as_served)
    return result, [w.kv_blocks_total for w in cluster.workers]


def rate(pairs) -> float:
    """Sum of hits over sum of queries of (hits, queries) pairs."""
    pairs = list(pairs)
    q = sum(p for _, p in pairs)
    return sum(h for h, _ in pairs) / q if q else math.nan


def evaluate(run: dict, encode, args) -> dict:
    rt = replay_trace(run["results"], encode, BLOCK, f"w{run['workers']}-g{run['groups']}")
    result, sim_kv = simulate_replay(rt, run, args)
    by_id = {r.id: r for r in result.cluster.metrics.finished}
    real = [(t.result.cached_tokens, t.result.usage_prompt_tokens or 0) for t in rt.turns]
    sim = [(by_id[i].cached_tokens, by_id[i].prompt_len) if i in by_id else (0, 0) for i in range(len(rt.turns))]
    turn = [t.turn for t in rt.turns]
    later = [i for i, k in enumerate(turn) if k > 0]
    view = run["world_view"]
    by_turn = [
        {
            "turn": k + 1,
            "real": rate(real[i] for i in range(len(turn)) if turn[i] == k),
            "sim": rate(sim[i] for i in range(len(turn)) if turn[i] == k),
        }
        for k in sorted(set(turn))
    ]
    # turns whose prompt does not start with the previous turn's prompt + answer, token for token
    context = [len(ids) for ids in rt.prompt_ids]
    broken = []
    for i in later:
        prev = max(j for j in range(i) if rt.turns[j].session == rt.turns[i].session)
        prev_ctx = context[prev] + int(rt.trace.output_len[prev])
        if rt.history_match[i] < prev_ctx:
            broken.append(
                {"session": rt.turns[i].session, "turn": turn[i] + 1, "match": rt.history_match[i], "of": prev_ctx}
            )
    differ = [
        {
            "session": rt.turns[i].session,
            "turn": turn[i] + 1,
            "real": real[i][0],
            "sim": sim[i][0],
            "prompt": real[i][1],
        }
        for i in range(len(turn))
        if real[i][0] != sim[i][0]
    ]
    return {
        "config": f"{run['workers']} worker{'s' if run['workers'] > 1 else ''} ({run['policy']}), "
        f"{run['groups']} system prompt{'s' if run['groups'] > 1 else ''}",
        "workers": run["workers"],
        "groups": run["groups"],
        "policy": run["policy"],
        "turns": len(rt.turns),
        "skipped_turns": rt.skipped,
        "real_kv_blocks": run["kv_blocks"],
        "sim_kv_blocks": sim_kv,
        "prefill_batch_tokens": run["prefill_batch_tokens"],
        "prompt_mismatches": rt.mismatches,
        "history_breaks": broken,
        "real_hit_rate": rate(real),
        "sim_hit_rate": rate(sim),
        "real_turn2_hit_rate": rate(real[i] for i in later),
        "sim_turn2_hit_rate": rate(sim[i] for i in later),
        "world_view_hit_rate": rate((w["hits"], w["queries"]) for w in view),
        "oracle_hit_rate": result.summary.get("prefix_cache_oracle_hit_rate", math.nan),
        "real_transitions": run.get("transitions"),  # FluidRole switches (to role), where the run saved them
        "sim_transitions": [t.dst_role.value for t in getattr(result.cluster.policy, "transitions", [])],
        "sim_completed": len(by_id),
        "sim_preemptions": result.summary["preemptions"],
        "turns_differing": differ,
        "by_turn": by_turn,
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(rows):
        turns = [b["turn"] for b in r["by_turn"]]
        ax.plot(turns, [b["real"] for b in r["by_turn"]], "o-", color=f"C{i}", label=f"{r['config']}: real")
        ax.plot(turns, [b["sim"] for b in r["by_turn"]], "x--", color=f"C{i}", label="sim")
    ax.set_xlabel("turn")
    ax.set_ylabel("cached / prompt tokens")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("prefix cache hit rate by turn: server vs simulator, same replay", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 4], help="worker counts (>1 runs --policy fluidpd)")
    ap.add_argument("--groups", type=int, nargs="+", default=[1], help="distinct system prompts (session i: i %% G)")
    add_session_args(ap)
    ap.add_argument("--num-kv-blocks", type=int, default=0, help="KV blocks per worker (0: prefix_cache.py's ample)")
    ap.add_argument("--resim", action="store_true", help="re-simulate the runs saved in --out (no server)")
    ap.add_argument("--out", type=Path, default=Path("results/prefix_cache_fidelity"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    encode = chat_encoder()
    rows = []
    for groups in args.groups:
        for w in args.workers:
            path = args.out / f"real_w{w}_g{groups}.json"
            if args.resim:
                run = load_run(path)
            else:
                run = real_run(w, groups, args)
                save_run(run, path)
            rows.append(evaluate(run, encode, args))
            r = rows[-1]
            print(
                f"  {r['config']}: real {r['real_hit_rate']:.1%}, sim {r['sim_hit_rate']:.1%} "
                f"({len(r['turns_differing'])} turns differ, {len(r['prompt_mismatches'])} prompt mismatches)",
                file=sys.stderr,
                flush=True,
            )
    report(rows, args)


def report(rows: list[dict], args) -> None:
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "prefix_cache_fidelity.json").write_text(json.dumps({"args": meta, "rows": rows}, indent=1) + "\n")
    plot(rows, args.out / "prefix_cache_fidelity.png")
    print(f"{'configuration':42} {'real':>7} {'sim':>7} {'gap':>7}  {'turn 2+ real':>12} {'sim':>7}", end="")
    print(f"  {'world view':>10} {'oracle':>7}")
    for r in rows:
        gap = 100 * (r["sim_hit_rate"] - r["real_hit_rate"])
        print(
            f"{r['config']:42} {r['real_hit_rate']:7.1%} {r['sim_hit_rate']:7.1%} {gap:+6.2f}p  "
            f"{r['real_turn2_hit_rate']:12.1%} {r['sim_turn2_hit_rate']:7.1%}  {r['world_view_hit_rate']:10.1%} "
            f"{r['oracle_hit_rate']:7.1%}"
        )
        if r["prompt_mismatches"]:
            print(f"    prompt ids rebuilt != the server's usage.prompt_tokens: {r['prompt_mismatches'][:5]}")
        if r["workers"] > 1:
            print(f"    FluidRole switches: real {r['real_transitions']}, sim {r['sim_transitions']}")
        if r["history_breaks"]:
            print(f"    {len(r['history_breaks'])} turns whose prompt does not extend the previous prompt + answer")
        for d in r["turns_differing"][:8]:
            print(
                f"    session {d['session']} turn {d['turn']}: cached real {d['real']}, sim {d['sim']} of {d['prompt']}"
            )
    print(f"wrote {args.out}/prefix_cache_fidelity.json and .png", file=sys.stderr)
    worst = max(rows, key=lambda r: abs(r["sim_hit_rate"] - r["real_hit_rate"]))
    parts = ", ".join(
        f"{r['workers']}w/{r['groups']}sp real {r['real_hit_rate']:.1%} sim {r['sim_hit_rate']:.1%}" for r in rows
    )
    gap = 100 * abs(worst["sim_hit_rate"] - worst["real_hit_rate"])
    print(f"prefix cache hit rate, simulator vs server, same replay: {parts}; worst gap {gap:.2f} points (target 2)")


if __name__ == "__main__":
    main()
