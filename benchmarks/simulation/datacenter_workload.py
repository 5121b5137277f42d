"""How fast the datacenter generator makes real-time traffic at scale, and in how much memory.

One claim: an hour at 5,000 req/s (18M requests) from the Azure code trace, sessions and prefix
block ids included, is generated in about a minute and within the host's memory. Prints the time
(wall and process CPU, the source trace already loaded; on a shared host CPU time is the steadier
figure), the process's peak RSS, and what was made (requests, sessions, block ids, hourly rates).

    .venv/bin/python benchmarks/simulation/datacenter_workload.py [--rate 5000] [--hours 1] [--source azure_code]
        [--no-ids]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from fluidpd.workload.registry import load_trace


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=5000.0, help="req/s")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--source", default="azure_code")
    ap.add_argument("--ids", action=argparse.BooleanOptionalAction, default=True, help="prefix block ids")
    args = ap.parse_args()
    kw = {"source": args.source, "hours": args.hours, "block_ids": args.ids}
    load_trace("datacenter", rate=1.0, **{**kw, "hours": 0.01})  # loads and caches the source trace
    before = peak_rss_gib()
    t0, c0 = time.perf_counter(), time.process_time()
    t = load_trace("datacenter", rate=args.rate, **kw)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = peak_rss_gib()
    assert t.session is not None
    in_sessions = t.session >= 0
    ids = sum(len(h) for h in t.hash_ids) if t.hash_ids is not None else 0
    hourly = np.bincount((t.arrival_s // 3600).astype(int)) / 3600
    print(f"source {args.source}: {len(t):,} requests over {t.duration_s:,.0f} s, mean {t.mean_rate:,.1f} req/s")
    print(f"hourly req/s: {', '.join(f'{r:,.0f}' for r in hourly)}")
    print(
        f"sessions {int(t.session.max()) + 1:,} holding {in_sessions.mean():.1%} of requests; "
        f"block ids named {ids:,} ({'on' if args.ids else 'off'})"
    )
    print(f"peak RSS {before:.2f} GiB before, {peak:.2f} GiB after")
    print(
        f"headline: {args.hours:g} h at {args.rate:,.0f} req/s from {args.source} ({len(t):,} requests, block ids "
        f"{'on' if args.ids else 'off'}): generated in {wall:.1f} s ({cpu:.1f} s CPU), peak RSS {peak:.2f} GiB"
    )


if __name__ == "__main__":
    main()
