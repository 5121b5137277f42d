"""The simulator's host-DRAM KV tier on Mooncake conversation sessions: hit rate against the
infinite-cache oracle, by tier, with and without the tier, per worker and pooled per node.

The kv experiment's cluster (8 x H100, Llama-3.1-8B BF16, prefix caching on) at its 80%-of-saturation
load (rate scale 1.13), fluidpd+kv-affinity from its tuned 2P:6D split, one 900 s window. Host tier
sizes are GiB per worker (`--kv-offloading-size`); an 8 x H100 node (DGX H100: 2 TiB of DRAM) gives
each of its GPUs up to 256 GiB. Loads run at the H100's PCIe rate (55 GB/s) and stall the worker's
next step; offloads are counted, not timed. Issue 37's goal: hit rate >= 90% of the oracle at 80%
load with a tier no larger than the node's DRAM. Writes sim_host_tier.png and .json to --out; the
headline is the last line.

    .venv/bin/python benchmarks/simulation/sim_host_tier.py [--sizes 0 64 256] [--window 900] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from fluidpd.bench.experiments.kv.setting import WORKLOADS, setup
from fluidpd.bench.simrun import run_instrumented

LOAD, SPLIT, ROUTER = 1.13, 2, "kv-affinity"  # the kv table's Mooncake 80% load and fluidpd's tuned split
NODE_DRAM_PER_GPU_GIB = 256


def run(trace, gib: float, pooled: bool) -> dict:
    s = setup(SPLIT, 0, router=ROUTER)
    sim = dataclasses.replace(s.sim, kv_offloading_size=gib, kv_offloading_pooled=pooled)
    m = run_instrumented(trace, "fluidpd", dataclasses.replace(s, sim=sim)).summary
    host = m.get("prefix_cache_host_hit_rate", 0.0)
    return {
        "gib": gib,
        "pooled": pooled,
        "hit": m["prefix_cache_hit_rate"],
        "host_hit": host,
        "device_hit": m["prefix_cache_hit_rate"] - host,
        "oracle": m["prefix_cache_oracle_hit_rate"],
        "joint": m["attainment"],
        "strict": m["strict_attainment"],
        "offloaded_blocks": m.get("host_tier_offloaded_blocks", 0),
        "loaded_blocks": m.get("host_tier_loaded_blocks", 0),
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [("none" if not r["gib"] else f"{r['gib']:g} GiB" + (" pooled" if r["pooled"] else "")) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    dev = [100 * r["device_hit"] for r in rows]
    host = [100 * r["host_hit"] for r in rows]
    ax.bar(labels, dev, label="device hit")
    ax.bar(labels, host, bottom=dev, label="host-tier hit")
    ax.axhline(100 * rows[0]["oracle"], color="k", ls="--", lw=1, label="infinite-cache oracle")
    ax.set_ylabel("prompt tokens served from cache (%)")
    ax.set_title("Mooncake conversation, 80% load, fluidpd+kv-affinity: host KV tier")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[0, 64, 256], help="host tier GiB per worker")
    ap.add_argument("--window", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=Path("results/sim_host_tier"))
    args = ap.parse_args()
    _, trace, _ = WORKLOADS["mooncake_conv"].windows(LOAD, args.window, 0)
    cases = [(g, False) for g in args.sizes] + [(g, True) for g in args.sizes if g]
    rows, t0 = [], time.perf_counter()
    for gib, pooled in tqdm(cases, desc="sim_host_tier", unit="run", file=sys.stderr):
        rows.append(run(trace, gib, pooled))
    print(f"Mooncake conversation x{LOAD} ({len(trace)} requests, {args.window:g} s), fluidpd+{ROUTER} from {SPLIT}P")
    head = ("host tier", "hit", "device", "host", "/oracle", "joint", "strict")
    print(f"{head[0]:>16} " + " ".join(f"{h:>7}" for h in head[1:]) + " loaded blocks")
    for r in rows:
        name = "none" if not r["gib"] else f"{r['gib']:g} GiB" + (" pooled" if r["pooled"] else "")
        print(
            f"{name:>16} {r['hit']:7.1%} {r['device_hit']:7.1%} {r['host_hit']:7.1%} {r['hit'] / r['oracle']:7.1%} "
            f"{r['joint']:7.1%} {r['strict']:7.1%} {r['loaded_blocks']}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim_host_tier.json").write_text(json.dumps({"load": LOAD, "window_s": args.window, "rows": rows}))
    plot(rows, args.out / "sim_host_tier.png")
    print(f"wall {time.perf_counter() - t0:.0f} s; wrote {args.out}/sim_host_tier.png and .json")
    node = [r for r in rows if r["gib"] and r["gib"] <= NODE_DRAM_PER_GPU_GIB]
    best = max(node or rows, key=lambda r: r["hit"])
    none = rows[0]
    print(
        f"headline: host tier {best['gib']:g} GiB/worker{' pooled' if best['pooled'] else ''}: hit rate "
        f"{best['hit']:.1%} = {best['hit'] / best['oracle']:.0%} of the oracle {best['oracle']:.1%} (goal >= 90%; "
        f"without a tier {none['hit']:.1%} = {none['hit'] / none['oracle']:.0%}); joint {best['joint']:.1%} vs "
        f"{none['joint']:.1%}, strict {best['strict']:.1%} vs {none['strict']:.1%}"
    )


if __name__ == "__main__":
    main()
