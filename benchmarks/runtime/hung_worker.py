"""How soon a hung worker is lost: SIGSTOP of the busiest decode worker while streams run.

3 process workers (SmolLM2), static-pd 1P:2D, the default heartbeat timeout (RuntimeConfig,
1 s) and step timeout (60 s). Six greedy streams; once one has 3 tokens the busiest decode worker
is stopped (alive, answering nothing). Each round prints when the cluster declared it lost, after
the stop, and why (heartbeat or step timeout); the streams must still finish. Target: the
heartbeat catches it within 5 s (its timeout plus a watch period or two), far below the step
timeout. The tests only check that it is the heartbeat that catches it.

    .venv/bin/python benchmarks/runtime/hung_worker.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import coordinator, prompt, timed
from tqdm import tqdm


async def one_round(seed: int, profile) -> dict:
    coord = coordinator("static-pd", 3, profile=profile, prefill_workers=1, tbt_slo_s=0.5)
    await coord.start()
    stopped: dict = {}
    try:
        streams = [asyncio.create_task(timed(coord, f"r{seed}-{i}", prompt(64, seed + i), 24)) for i in range(6)]
        while not any(w.num_decoding for w in coord.cluster.workers if w.role.value == "decode"):
            await asyncio.sleep(0.01)
        ws = [w for w in coord.cluster.workers if w.role.value == "decode"]
        wid = max(ws, key=lambda w: (w.num_decoding, -w.id)).id
        stopped = {"worker": wid, "at_s": coord.cluster.now, "pid": coord.backends[wid].pid}
        os.kill(stopped["pid"], signal.SIGSTOP)
        results = await asyncio.gather(*streams)
        (loss,) = [x for x in coord.cluster.losses if x["worker"] == wid]
        return {
            "detect_s": loss["at_s"] - stopped["at_s"],
            "reason": loss["reason"],
            "lost": sum(1 for r in results if r["error"] or len(r["tokens"]) != 24),
        }
    finally:
        if stopped:
            with contextlib.suppress(ProcessLookupError):  # the cluster kills a worker it has lost
                os.kill(stopped["pid"], signal.SIGCONT)
        await coord.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    profile = coordinator("colocated", 1, backend="inprocess").profile
    rows = [asyncio.run(one_round(1000 * r, profile)) for r in tqdm(range(args.rounds), desc="rounds", file=sys.stderr)]
    for i, row in enumerate(rows):
        print(f"round {i}: lost after {row['detect_s']:.2f} s ({row['reason']}); requests lost {row['lost']}")
    med = statistics.median(r["detect_s"] for r in rows)
    by_heartbeat = sum("heartbeat" in r["reason"] for r in rows)
    print(
        f"headline: a hung worker is lost after {med:.2f} s (median of {args.rounds}; "
        f"{by_heartbeat}/{args.rounds} by heartbeat; target <= 5 s)"
    )


if __name__ == "__main__":
    main()
