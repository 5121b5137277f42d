"""FluidRole in place, through the real coordinator, vs restarting the worker.

A 3-worker cluster (process per worker, SmolLM2) serves live decodes; an admin switch turns a busy
decode worker into a prefill worker: drain (live KV migrated to a peer), remap (`resize_kv`),
dispatch swap, route update, each timed. The same worker's cold restart (spawn, weight load from
the GGUF, warm-up) and warm restart (weights staged in shared memory) are measured in the same run
(benchmarks/runtime/runtime_restart.py). Targets: restart / in place >= 100x; remap <= 10 ms.

    .venv/bin/python benchmarks/runtime/runtime_fluidrole.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import CONFIG, coordinator, prompt, timed
from runtime_restart import measure_restarts


async def one_switch(coord, n_requests: int) -> dict:
    await coord.start()
    try:
        tasks = [asyncio.create_task(timed(coord, f"r{i}", prompt(96, i), 80)) for i in range(n_requests)]
        while sum(w.num_decoding for w in coord.cluster.workers) < n_requests // 2:
            await asyncio.sleep(0.05)
        busiest = max((w for w in coord.cluster.workers if w.role.value == "decode"), key=lambda w: w.num_decoding)
        coord.force_role(busiest.id, "prefill")
        while True:
            ts = coord.cluster.policy.transitions
            if ts and ts[-1].done:
                break
            await asyncio.sleep(0.01)
        results = await asyncio.gather(*tasks)
        t = ts[-1]
        assert all(len(r["times"]) == 80 for r in results), "a request lost tokens"
        return {**t.durations(), "total": t.total_s, "migrated": len(t.migrated)}
    finally:
        await coord.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
    args = ap.parse_args()
    from tqdm import tqdm

    runs = []
    for _ in tqdm(range(args.repeats), desc="FluidRole switches", file=sys.stderr):
        coord = coordinator("fluidpd", 3, prefill_workers=1, ttft_slo_s=30.0, tbt_slo_s=2.0)
        runs.append(asyncio.run(one_switch(coord, args.requests)))
    med = {k: statistics.median(r[k] for r in runs) for k in ("drain", "remap", "dispatch", "route", "total")}
    print(
        f"FluidRole decode->prefill through the coordinator, {args.requests} live requests, median of {args.repeats}:"
    )
    print(
        "  "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items())
        + f"; migrated {statistics.median(r['migrated'] for r in runs):.0f} requests"
    )
    t0 = time.perf_counter()
    r = measure_restarts(CONFIG, num_requests=4, prompt_len=96)
    print(
        f"cold restart {r['cold_restart_s']:.2f} s, warm restart {r['warm_restart_s']:.2f} s "
        f"(measured in {time.perf_counter() - t0:.0f} s)"
    )
    print(
        f"headline: FluidRole in place {med['total'] * 1e3:.0f} ms (remap {med['remap'] * 1e3:.1f} ms) vs cold "
        f"restart {r['cold_restart_s']:.2f} s = {r['cold_restart_s'] / med['total']:.0f}x, warm restart "
        f"{r['warm_restart_s']:.2f} s = {r['warm_restart_s'] / med['total']:.0f}x"
    )


if __name__ == "__main__":
    main()
