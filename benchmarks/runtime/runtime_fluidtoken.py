"""FluidToken under a prefill burst on the real runtime: static-pd vs fluidtoken, same cluster.

3 process workers (SmolLM2): 1 prefill, 2 decode. Long decodes run; then a burst of 384-token
prompts arrives, sized from this host's measured prefill speed (the profile the coordinator
measured at startup): `--burst-share` (1.5) TTFT SLOs of one prefill worker's work, so the prefill
worker alone misses and borrowing decode slack can help on any host (`--burst N` fixes the count;
10 before 2026-12-04). Reports the P99 inter-token gap of the running decodes during the burst
(must stay within SLO_TBT while borrowing), the P99 TTFT of the burst, the TTFT gain of fluidtoken,
and the host's speeds.

    .venv/bin/python benchmarks/runtime/runtime_fluidtoken.py [--burst-share 1.5 | --burst 10]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_common import coordinator, percentile, prompt, timed

SLO_TBT, SLO_TTFT = 0.6, 10.0


BURST_LEN = 384


def burst_size(profile, share: float) -> int:
    """Prompts of BURST_LEN tokens that hold `share` TTFT SLOs of one prefill worker's work here."""
    return max(2, math.ceil(share * SLO_TTFT / profile.prefill_time(BURST_LEN)))


async def burst(coord, n_burst: int, n_decodes=6, burst_len=BURST_LEN) -> dict:
    await coord.start()
    try:
        decodes = [asyncio.create_task(timed(coord, f"d{i}", prompt(32, i), 120)) for i in range(n_decodes)]
        while sum(w.num_decoding for w in coord.cluster.workers) < n_decodes:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        bursts = await asyncio.gather(*(timed(coord, f"b{i}", prompt(burst_len, 100 + i), 4) for i in range(n_burst)))
        end = loop.time()
        dec = await asyncio.gather(*decodes)
        gaps = []
        for r in dec:
            for a, b in zip(r["times"], r["times"][1:]):
                if a >= start - 0.0 and b <= end + 1.0:
                    gaps.append(b - a)
        borrowed = getattr(coord.cluster.policy, "token", None)
        return {
            "decode_gap_p99": percentile(gaps, 0.99),
            "decode_gap_p50": percentile(gaps, 0.5),
            "ttft_p99": percentile([r["ttft"] for r in bursts], 0.99),
            "ttft_p50": percentile([r["ttft"] for r in bursts], 0.5),
            "gaps": len(gaps),
            "borrowed": borrowed.borrowed if borrowed else 0,
        }
    finally:
        await coord.stop()


def main() -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burst-share", type=float, default=1.5, help="the burst's work, in TTFT SLOs of a prefill worker")
    ap.add_argument("--burst", type=int, default=0, help="a fixed number of burst prompts instead")
    args = ap.parse_args()
    out, profile, n_burst = {}, None, args.burst
    for policy in tqdm(["static-pd", "fluidtoken"], desc="policies", file=sys.stderr):
        coord = coordinator(policy, 3, profile=profile, prefill_workers=1, ttft_slo_s=SLO_TTFT, tbt_slo_s=SLO_TBT)
        profile = coord.profile
        n_burst = n_burst or burst_size(profile, args.burst_share)
        out[policy] = asyncio.run(burst(coord, n_burst))
    assert profile is not None
    host = (
        f"host: prefill {512 / profile.prefill_time(512):.0f} tok/s "
        f"(f_P({BURST_LEN}) {profile.prefill_time(BURST_LEN):.2f} s), decode step "
        f"{profile.decode_step_s * 1e3:.1f} ms; burst {n_burst} x {BURST_LEN} tokens"
        + ("" if args.burst else f" = {args.burst_share:g} TTFT SLOs of one prefill worker's work")
    )
    print(host)
    for policy, r in out.items():
        print(
            f"{policy:10s}: burst TTFT p50 {r['ttft_p50']:.2f} s p99 {r['ttft_p99']:.2f} s; running decodes' gap "
            f"p50 {r['decode_gap_p50'] * 1e3:.0f} ms p99 {r['decode_gap_p99'] * 1e3:.0f} ms over {r['gaps']} gaps "
            f"(SLO_TBT {SLO_TBT * 1e3:.0f} ms); borrowed {r['borrowed']}"
        )
    s, f = out["static-pd"], out["fluidtoken"]
    print(
        f"headline: FluidToken burst ({n_burst} prompts) P99 TTFT {f['ttft_p99']:.2f} s vs static-pd "
        f"{s['ttft_p99']:.2f} s ({s['ttft_p99'] / f['ttft_p99']:.2f}x better); P99 decode gap "
        f"{f['decode_gap_p99'] * 1e3:.0f} ms (static-pd {s['decode_gap_p99'] * 1e3:.0f} ms, SLO {SLO_TBT * 1e3:.0f} ms)"
    )


if __name__ == "__main__":
    main()
