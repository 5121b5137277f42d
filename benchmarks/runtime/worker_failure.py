"""Worker failure under steady load: kill -9 of a random worker every 20 s for 3 minutes.

3 process workers (SmolLM2, weights staged to /dev/shm so a replacement starts in seconds), fluidpd,
open-loop Poisson arrivals. Every request is greedy with a known reference output (a plain
engine's), so a lost or repeated token shows as a mismatch. Prints requests lost (errored or
unfinished; target 0), tokens lost or repeated (target 0), the longest stall of a stream (the
largest gap between two of its tokens), the kills and the replacements that joined.

    .venv/bin/python benchmarks/runtime/worker_failure.py [--duration 180] [--kill-every 20] [--rate 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import CONFIG, coordinator, percentile, prompt, timed
from tqdm import tqdm

from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.profile import profile_engine
from fluidpd.runtime.staging import stage_weights

PROMPTS, MAX_TOKENS = 8, 32


async def run(args, coord, refs: list[list[int]], ids: list[list[int]]) -> dict:
    await coord.start()
    rng = random.Random(args.seed)
    tasks, kills, statuses = [], [], []
    t0 = time.perf_counter()
    bar = tqdm(total=int(args.duration), desc="load + kills", unit="s", file=sys.stderr)
    try:
        next_arrival, next_kill, i = 0.0, args.kill_every, 0
        while (now := time.perf_counter() - t0) < args.duration:
            if now >= next_arrival:
                k = i % PROMPTS
                tasks.append((k, asyncio.create_task(timed(coord, f"r{i}", ids[k], MAX_TOKENS))))
                i += 1
                next_arrival += rng.expovariate(args.rate)
            if now >= next_kill:
                up = [w for w in range(len(coord.backends)) if w not in coord.cluster.down]
                wid = rng.choice(up)
                os.kill(coord.backends[wid].pid, signal.SIGKILL)
                kills.append((round(now, 1), wid))
                next_kill += args.kill_every
            statuses.append(coord.status()["status"])
            if int(now) > bar.n:
                bar.update(int(now) - bar.n)
            await asyncio.sleep(0.05)
        results = []
        for k, t in tasks:
            try:
                results.append((k, await asyncio.wait_for(t, 300)))
            except Exception as exc:  # noqa: BLE001 - counted as lost
                results.append((k, {"error": f"{type(exc).__name__}: {exc}"}))
        for _ in range(600):
            if coord.status()["status"] == "ok":
                break
            await asyncio.sleep(0.1)
        state = coord.cluster_state()
    finally:
        bar.close()
        await coord.stop()
    lost = wrong = 0
    stalls = []
    for k, r in results:
        got = r.get("tokens")
        if r.get("error") or got is None or len(got) != MAX_TOKENS:
            lost += 1
            continue
        wrong += sum(1 for a, b in zip(got, refs[k], strict=True) if a != b)
        stalls.append(max(r["gaps"], default=0.0))
    return {
        "requests": len(results),
        "lost": lost,
        "tokens_wrong": wrong,
        "stall_max_s": max(stalls, default=float("nan")),
        "stall_p50_s": percentile(stalls, 0.5),
        "kills": kills,
        "losses": state["losses"],
        "final_status": coord.status()["status"] if coord.cluster else "stopped",
        "degraded_share": statuses.count("degraded") / max(1, len(statuses)),
        "leaked_blocks": sum(w["kv_blocks_used"] for w in state["workers"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=180.0)
    ap.add_argument("--kill-every", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second (Poisson)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    stage = tempfile.mkdtemp(prefix="fluidpd-bench-weights-", dir="/dev/shm")
    try:
        config = stage_weights(CONFIG, stage)
        model, tok = load_model(config)
        engine = LLMEngine(config, model=model, tokenizer=tok)
        ids = [prompt(48 + 16 * k, seed=k) for k in range(PROMPTS)]
        refs = [list(o.token_ids) for o in engine.generate(ids, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]
        profile = profile_engine(engine, lengths=(16, 64, 256), repeats=2)
        del engine, model
        coord = coordinator(
            "fluidpd", 3, profile=profile, prefill_workers=1, config=config, tbt_slo_s=0.6, ttft_slo_s=10.0
        )
        r = asyncio.run(run(args, coord, refs, ids))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(f"kills (s, worker): {r['kills']}")
    for loss in r["losses"]:
        print(
            f"  lost worker {loss['worker']} at {loss['at_s']:.1f} s ({loss['reason']}): {loss['restarted']} restarted"
        )
    print(
        f"{r['requests']} requests; degraded {r['degraded_share']:.0%} of the time; final status {r['final_status']}; "
        f"leaked KV blocks {r['leaked_blocks']}; stream stall p50 {r['stall_p50_s'] * 1e3:.0f} ms"
    )
    print(
        f"headline: {len(r['kills'])} kill -9s in {args.duration:g} s: requests lost {r['lost']} (target 0), "
        f"tokens lost or repeated {r['tokens_wrong']} (target 0), longest stream stall {r['stall_max_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
