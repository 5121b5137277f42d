"""SIGTERM under load: `fluidpd serve` drains its admitted requests, then exits leaving nothing behind.

`fluidpd serve --workers 2 --backend process` (SmolLM2, fluidpd) with a node KV store in /dev/shm
(--kv-offloading-size). An open-loop load of `--requests` streamed completions (Poisson arrivals over
`--duration-s`, mixed prompt and output lengths, admission control off) and one SIGTERM at
`--signal-at` of the way through. Reported: the requests admitted (HTTP 200) and of them the ones lost
(not ended with all their tokens and a finish reason), those refused with 503 while draining and
those that found the server gone, the drain's duration (signal to exit), the exit code, and the
server's processes (as listed just before the signal) and shared-memory segments still there after
the exit. Target: 0 admitted lost, 0 processes, 0 segments, exit 0. JSON and a timeline PNG go to
--out.

    .venv/bin/python benchmarks/runtime/graceful_drain.py [--requests 40] [--duration-s 20] [--signal-at 0.5]

About 2 minutes on a busy 2-core host (most of it the server's start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from prefix_cache import free_port
from runtime_azure_code import wait_healthy
from runtime_common import prompt
from tqdm import tqdm

from fluidpd.bench.leftovers import descendants, processes_left, segments_left
from fluidpd.bench.peers.process import SERVE

OUTCOMES = ("completed", "lost", "refused 503", "server gone", "other error")
COLORS = {"completed": "tab:green", "lost": "tab:red", "refused 503": "tab:orange", "server gone": "tab:grey"}


@dataclass
class Sent:
    """What the client saw of one streamed request: status, tokens, finish, an error event or a broken connection."""

    index: int
    max_tokens: int
    send_s: float = math.nan
    end_s: float = math.nan
    status: int | None = None  # None: no response at all
    tokens: int = 0  # usage.completion_tokens
    finish: str | None = None
    done: bool = False  # [DONE] came
    error: str | None = None  # an error event, an error body or the exception


def serve_cmd(port: int, args) -> list[str]:
    return [
        *SERVE, "--workers", str(args.workers), "--backend", "process",
        "--num-kv-blocks", str(args.num_kv_blocks), "--max-model-len", str(args.max_len),
        "--kv-offloading-size", str(args.store_gib), "--admit-ttft-factor", "0",
        "--shutdown-timeout-s", str(args.shutdown_timeout_s), "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip


def plan(args) -> list[tuple[float, list[int], int]]:
    """(arrival, prompt ids, max_tokens) of every request: Poisson arrivals, mixed lengths."""
    rng = random.Random(args.seed)
    t, reqs = 0.0, []
    for i in range(args.requests):
        t += rng.expovariate(args.requests / args.duration_s)
        reqs.append((t, prompt(rng.randint(16, 192), seed=i), rng.randint(16, 96)))
    return reqs


async def stream_one(client: httpx.AsyncClient, url: str, ids: list[int], out: Sent, t0: float) -> None:
    body = {"prompt": ids, "max_tokens": out.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    out.send_s = time.perf_counter() - t0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            out.status = r.status_code
            if r.status_code != 200:
                out.error = (await r.aread()).decode(errors="replace")[:200]
            async for line in r.aiter_lines():
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    out.done = True
                elif line.startswith("data: "):
                    obj = json.loads(data)
                    out.error = json.dumps(obj["error"]) if "error" in obj else out.error
                    out.finish = next(
                        (c["finish_reason"] for c in obj.get("choices", []) if c["finish_reason"]), out.finish
                    )
                    out.tokens = (obj.get("usage") or {}).get("completion_tokens", out.tokens)
    except httpx.TransportError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.end_s = time.perf_counter() - t0


def outcome(s: Sent) -> str:
    if s.status == 200:
        whole = s.error is None and s.done and s.finish in ("stop", "length") and s.tokens == s.max_tokens
        return "completed" if whole else "lost"
    if s.status == 503:
        return "refused 503"
    if s.status is None:  # never reached the server, or (maybe admitted) no answer at all
        return "server gone" if s.error and s.error.startswith("ConnectError") else "lost"
    return "other error"


async def load(url: str, reqs: list, proc: subprocess.Popen, signal_s: float) -> dict:
    """Send `reqs` open-loop, SIGTERM the server at `signal_s`; what each request saw, and the server while draining."""
    sent = [Sent(i, n) for i, (_, _, n) in enumerate(reqs)]
    seen: dict = {}
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)  # a fresh connection each
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=30.0), trust_env=False) as client:

        async def one(i: int) -> None:
            arrival, ids, _ = reqs[i]
            await asyncio.sleep(max(0.0, arrival - (time.perf_counter() - t0)))
            await stream_one(client, url, ids, sent[i], t0)
            bar.update()

        async def terminate() -> None:
            await asyncio.sleep(signal_s)
            seen["tree"] = descendants(proc.pid)
            seen["signal_s"] = time.perf_counter() - t0
            proc.send_signal(signal.SIGTERM)
            try:  # what a load balancer sees while it drains
                while (health := await client.get(url + "/health")).status_code == 200:
                    await asyncio.sleep(0.02)
                seen["health"] = {"status_code": health.status_code, "body": health.json()}
                r = await client.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
                seen["refused"] = {"status_code": r.status_code, "retry_after": r.headers.get("Retry-After")}
            except httpx.TransportError as exc:
                seen["health"] = f"server gone before it was asked ({type(exc).__name__})"
            seen["exit_code"] = await asyncio.to_thread(proc.wait)
            seen["exit_s"] = time.perf_counter() - t0

        with tqdm(total=len(reqs), desc="requests", file=sys.stderr) as bar:
            await asyncio.gather(terminate(), *(one(i) for i in range(len(reqs))))
    return seen | {"sent": sent}


def plot(sent: list[Sent], seen: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for s in sent:
        ax.plot([s.send_s, max(s.end_s, s.send_s + 0.2)], [s.index] * 2, color=COLORS.get(outcome(s), "black"), lw=3)
    for kind, color in COLORS.items():
        ax.plot([], [], color=color, lw=3, label=kind)
    ax.axvline(seen["signal_s"], color="black", ls="--", label="SIGTERM")
    ax.axvline(seen["exit_s"], color="black", ls=":", label=f"exit {seen['exit_code']}")
    ax.set_xlabel("seconds since the load began")
    ax.set_ylabel("request")
    ax.set_title("fluidpd serve: SIGTERM under load (each request from its send to its end)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--duration-s", type=float, default=20.0, help="the arrivals' span (Poisson)")
    ap.add_argument("--signal-at", type=float, default=0.5, help="SIGTERM at this fraction of --duration-s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--num-kv-blocks", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=512, help="--max-model-len")
    ap.add_argument("--store-gib", type=float, default=0.02, help="--kv-offloading-size")
    ap.add_argument("--shutdown-timeout-s", type=float, default=120.0, help="far above the drain this load needs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/graceful_drain"))
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / "fluidpd-graceful-drain.log"
    print(f"graceful_drain: starting the server (log {log_path}) ...", file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_cmd(port, args), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc)
        state = httpx.get(url + "/v1/admin/cluster").json()
        store = state["kv_store"]["path"]
        store_there = os.path.exists(store)
        seen = asyncio.run(load(url, plan(args), proc, args.signal_at * args.duration_s))
    finally:
        if proc.poll() is None:
            proc.kill()
    tree = seen["tree"]
    server = {
        "workers": [w["pid"] for w in state["workers"]],
        "processes_before_signal": tree,
        "store": store,
        "store_there_while_serving": store_there,
        "processes_left": processes_left(tree),
        "segments_left": segments_left(proc.pid, tree),
        "drain_s": seen["exit_s"] - seen["signal_s"],
        "log": re.findall(r"fluidpd serve: ((?:draining|drained|cut) .*)", log_path.read_text()),
    }
    report(seen, server, args)


def report(seen: dict, server: dict, args) -> None:
    sent: list[Sent] = seen["sent"]
    kinds = {k: [s for s in sent if outcome(s) == k] for k in OUTCOMES}
    before = [s for s in sent if s.send_s < seen["signal_s"]]
    admitted = sum(s.status == 200 for s in sent)
    out = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "signal_s": seen["signal_s"],
        "sent_before_signal": len(before),
        "admitted": admitted,
        "by_outcome": {k: len(v) for k, v in kinds.items()},
        "lost": [vars(s) for s in kinds["lost"]],
        "health_while_draining": seen.get("health"),
        "new_request_while_draining": seen.get("refused"),
        "exit_code": seen["exit_code"],
        "server": server,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graceful_drain.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(sent, seen, args.out / "graceful_drain.png")
    print(f"wrote {args.out}/graceful_drain.json and graceful_drain.png", file=sys.stderr)
    print(f"{len(sent)} requests over {args.duration_s:g} s, SIGTERM at {seen['signal_s']:.1f} s")
    print(f"  sent before the signal {len(before)}; admitted (HTTP 200) {admitted}")
    for k in OUTCOMES:
        print(f"  {k:12s} {len(kinds[k])}")
    print(f"  /health while draining: {seen.get('health')}")
    print(f"  a new request while draining: {seen.get('refused')}")
    print(f"  server log: {'; '.join(server['log'])}")
    print(f"  store {server['store']} there while serving: {server['store_there_while_serving']}")
    print(f"  processes left {server['processes_left']} (of {len(server['processes_before_signal'])})")
    print(f"  segments left {server['segments_left']}")
    print(
        f"graceful drain: {len(kinds['lost'])} of {admitted} admitted lost, {len(server['processes_left'])} processes, "
        f"{len(server['segments_left'])} segments left, exit {seen['exit_code']} (drain {server['drain_s']:.1f} s)"
    )


if __name__ == "__main__":
    main()
