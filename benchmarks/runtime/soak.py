"""Soak: 10 minutes of mixed streaming load through the HTTP server, with aborts and forced role switches.

The real server (`build_app` over 3 process workers, fluidpd, SmolLM2 weights staged to /dev/shm)
on a background thread; clients over HTTP with Poisson arrivals: streamed and whole completions,
streamed chat, and streams the client abandons after a few chunks. Every ~15 s the admin API
switches a worker whose role has two serving workers (a 409 while a switch is under way is the
API working, not an error). Greedy outputs: every answer for a prompt must equal the first one.

RSS of the server process and of every worker is sampled every 5 s; growth is measured from the
end of the warm-up (the first minute: allocator pools and compiled paths settle) to the end.
After the load drains: KV blocks still in use (the world's accounting and each engine's own)
and shared-memory segments left behind. Writes results/soak/rss.png.

    .venv/bin/python benchmarks/runtime/soak.py [--duration 600] [--rate 1.5] [--switch-every 15]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import CONFIG, coordinator
from tqdm import tqdm

from fluidpd.core.memory import rss_bytes
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.runtime.profile import profile_engine
from fluidpd.runtime.staging import stage_weights
from fluidpd.server import BackgroundServer, build_app

TOPICS = ["the sea", "paged attention", "a small village", "prefill and decode", "the moon", "rivers", "trains"]
MAX_TOKENS, WARMUP_S, SAMPLE_S = 24, 60.0, 5.0
KINDS = (("stream", 0.55), ("whole", 0.15), ("chat", 0.15), ("abort", 0.15))


def body(kind: str, k: int, model: str) -> tuple[str, dict]:
    text = f"Write two sentences about {TOPICS[k]}."
    common = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    if kind == "chat":
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}], "stream": True}
    return "/v1/completions", {**common, "prompt": text, "stream": kind != "whole"}


async def one(client: httpx.AsyncClient, kind: str, k: int, out: dict) -> None:
    """One request; records (kind, prompt) -> text, or an error."""
    path, payload = body(kind, k, out["model"])
    try:
        if kind == "whole":
            r = await client.post(path, json=payload)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            choice = r.json()["choices"][0]
            text, n = choice["text"], r.json()["usage"]["completion_tokens"]
            if n != MAX_TOKENS:
                raise RuntimeError(f"{n} tokens, not {MAX_TOKENS}")
            out["texts"].setdefault(("completion", k), []).append(text)
            return
        pieces, chunks = [], 0
        async with client.stream("POST", path, json=payload) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"in-band error: {event['error']}")
                for c in event.get("choices", ()):
                    pieces.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
                chunks += 1
                if kind == "abort" and chunks >= 3:
                    out["aborted"] += 1
                    return  # leaving the block closes the connection mid-stream
        key = ("chat" if kind == "chat" else "completion", k)
        out["texts"].setdefault(key, []).append("".join(pieces))
    except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
        out["errors"].append(f"{kind}: {type(exc).__name__}: {exc}")


async def switcher(client: httpx.AsyncClient, out: dict) -> None:
    state = (await client.get("/v1/admin/cluster")).json()
    roles = [w["role"] for w in state["workers"]]
    wid = next((i for i, r in enumerate(roles) if roles.count(r) == 2), None)
    if wid is None:
        return
    role = "decode" if roles[wid] == "prefill" else "prefill"
    r = await client.post(f"/v1/admin/workers/{wid}/role", json={"role": role})
    if r.status_code == 200:
        out["switches"] += 1
    elif r.status_code == 409:
        out["conflicts"] += 1
    else:
        out["errors"].append(f"switch: HTTP {r.status_code}: {r.text[:200]}")


async def drive(args, url: str, pids) -> dict:
    rng = random.Random(args.seed)
    out: dict = {"texts": {}, "errors": [], "aborted": 0, "switches": 0, "conflicts": 0, "rss": []}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        out["model"] = (await client.get("/v1/models")).json()["data"][0]["id"]
        tasks: list[asyncio.Task] = []
        t0 = time.perf_counter()
        next_arrival, next_switch, next_sample, n = 0.0, args.switch_every, 0.0, 0
        bar = tqdm(total=int(args.duration), desc="soak", unit="s", file=sys.stderr)
        while (now := time.perf_counter() - t0) < args.duration:
            if now >= next_arrival:
                kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
                tasks.append(asyncio.create_task(one(client, kind, n % len(TOPICS), out)))
                n += 1
                next_arrival += rng.expovariate(args.rate)
            if now >= next_switch:
                tasks.append(asyncio.create_task(switcher(client, out)))
                next_switch += args.switch_every
            if now >= next_sample:
                out["rss"].append((now, [rss_bytes(p) for p in pids()]))
                next_sample += SAMPLE_S
            tasks = [t for t in tasks if not t.done()]
            bar.update(int(now) - bar.n)
            bar.set_postfix(requests=n, errors=len(out["errors"]), switches=out["switches"])
            await asyncio.sleep(0.02)
        bar.close()
        await asyncio.gather(*tasks)
        await asyncio.sleep(2.0)  # aborted streams are dropped by the runtime within a step or two
        out["rss"].append((time.perf_counter() - t0, [rss_bytes(p) for p in pids()]))
        out["requests"] = n
        out["state"] = (await client.get("/v1/admin/cluster")).json()
    return out


def plot(rss: list, names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ts = [t for t, _ in rss]
    for i, name in enumerate(names):
        ax.plot(ts, [r[i] / 2**20 for _, r in rss], label=name)
    ax.axvline(WARMUP_S, color="grey", ls="--", lw=0.8, label="end of warm-up")
    ax.set(xlabel="time (s)", ylabel="RSS (MiB)", title="soak: resident memory per process")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--rate", type=float, default=1.5, help="requests per second (Poisson)")
    ap.add_argument("--switch-every", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results/soak"))
    args = ap.parse_args()
    stage = tempfile.mkdtemp(prefix="fluidpd-bench-weights-", dir="/dev/shm")
    shm_before = set(glob.glob("/dev/shm/*"))
    try:
        config = stage_weights(CONFIG, stage)
        model, tok = load_model(config)
        profile = profile_engine(LLMEngine(config, model=model, tokenizer=tok), lengths=(16, 64, 256), repeats=2)
        del model
        coord = coordinator(
            "fluidpd", 3, profile=profile, prefill_workers=1, config=config, tbt_slo_s=0.6, ttft_slo_s=10.0
        )
        with BackgroundServer(build_app(coord)) as srv:
            pids = lambda: [os.getpid(), *(b.pid for b in coord.backends)]
            r = asyncio.run(drive(args, srv.url, pids))
            engine_blocks = [b.submit("stats").result(30).num_used_blocks for b in coord.backends]
        shm_left = sorted(set(glob.glob("/dev/shm/*")) - shm_before - {stage})
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    names = ["server"] + [f"worker {i}" for i in range(len(r["rss"][0][1]) - 1)]
    plot(r["rss"], names, args.out / "rss.png")
    base = next(s for t, s in r["rss"] if t >= WARMUP_S)
    end = r["rss"][-1][1]
    for name, b, e in zip(names, base, end):
        print(f"  {name}: RSS {b / 2**20:.0f} -> {e / 2**20:.0f} MiB ({(e - b) / b:+.2%})")
    growth = (sum(end) - sum(base)) / sum(base)
    state = r["state"]
    world_blocks = sum(w["kv_blocks_used"] for w in state["workers"])
    wrong = sum(len(set(v)) - 1 for v in r["texts"].values())  # greedy: every answer equal to the first
    done = [t for t in state.get("transitions", []) if t["done"]]
    for e in r["errors"][:10]:
        print(f"  error: {e}")
    print(
        f"{r['requests']} requests in {args.duration:g} s ({r['aborted']} abandoned mid-stream by their client), "
        f"{r['switches']} forced switches ({r['conflicts']} refused with 409 while one was under way; "
        f"{len(done)} of the last {len(state.get('transitions', []))} transitions done), "
        f"outstanding {state['outstanding']}"
    )
    print(
        f"answers differing from the first for their prompt: {wrong}; KV blocks in use: world {world_blocks}, "
        f"engines {engine_blocks}; shared-memory segments left: {len(shm_left)}; wrote {args.out / 'rss.png'}"
    )
    print(
        f"soak: RSS growth {growth:+.2%} after warm-up (target <= 5%), leaked KV blocks "
        f"{world_blocks + sum(engine_blocks)} (target 0), errors {len(r['errors']) + wrong} (target 0) "
        f"in {args.duration:g} s"
    )


if __name__ == "__main__":
    main()
