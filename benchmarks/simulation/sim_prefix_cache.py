"""Prefix caching in the simulator: every serving policy with the cache on and off, on Claude Code
sessions and Mooncake conversation sessions (closed loop), 8 x H100 as 4 workers at TP 2, Llama-3.3-70B
FP8 (at TP 1 a worker holds 23k tokens of KV: a Claude Code context of ~100k tokens never fits).

Per run: the token hit rate beside two bounds, TTFT p50/p99, joint and strict attainment.
  oracle        an infinite cache shared by all workers (the upper bound the trace allows)
  routing bound an infinite cache on each worker, the requests placed where the policy placed them
                (what is lost between oracle and routing bound is routing's; between routing bound and
                hit rate, finite capacity's and concurrency's: a prefix still being computed is a miss)

Target: hit rate >= 95% of the oracle where the capacity suffices. Writes sim_prefix_cache.png and .json
to --out; the headline is the last line.

    .venv/bin/python benchmarks/simulation/sim_prefix_cache.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fluidpd.core.metrics import Slo, hit_rate
from fluidpd.core.request import Request
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.claude_code import load_claude_code
from fluidpd.workload.loaders import load_mooncake
from fluidpd.workload.trace import Trace
from fluidpd.world.prefix_cache import PrefixCache

POLICIES = ("colocated", "chunked", "static-pd", "distserve", "fluidtoken", "fluidpd")  # prefill-/decode-only: phases
SLO = Slo(ttft_s=2.0, tbt_s=0.040)  # Table 1's


@dataclass(frozen=True, slots=True)
class Workload:
    """A session trace window: what it is, how to load it."""

    name: str
    source: str  # claude_code or mooncake_conv
    about: str
    start_s: float
    duration_s: float
    concurrency: float = 0.0  # Claude Code: mean active sessions
    rate_scale: float = 1.0  # Mooncake: time compression

    def trace(self) -> Trace:
        if self.source == "claude_code":
            t = load_claude_code(with_hashes=True, sessions=True, concurrency=self.concurrency)
        else:
            t = load_mooncake(kind="conversation", sessions=True).scale_rate(self.rate_scale)
        return t.window(self.start_s, self.duration_s)


def workloads(quick: bool) -> list[Workload]:
    d = 900.0 if quick else 1800.0
    return [
        Workload("claude_c32", "claude_code", "Claude Code sessions (agents chained), concurrency 32", 3600.0, d, 32),
        Workload("claude_c64", "claude_code", "Claude Code sessions (agents chained), concurrency 64", 3600.0, d, 64),
        Workload("mooncake_conv", "mooncake_conv", "Mooncake conversation sessions, rate x0.25", 600.0, d, 0, 0.25),
    ]


def setup(cache: bool) -> Setup:
    return Setup(
        get_model("llama-3.3-70b", "fp8"),
        get_hardware("h100"),
        SLO,
        SimConfig(n_workers=4, tp=2, enable_prefix_caching=cache),
        PolicyConfig(),
    )


class EverCache(PrefixCache):
    """A PrefixCache that also remembers every block it ever held (the routing bound's infinite cache)."""

    __slots__ = ("ever",)

    def __init__(self) -> None:
        super().__init__()
        self.ever: set[int] = set()

    def register(self, rid, hashes, n):
        self.ever.update(hashes[:n])
        return super().register(rid, hashes, n)

    def release(self, rid, hashes, n, demote=False):
        self.ever.update(hashes[:n])
        return super().release(rid, hashes, n, demote)


def routing_bound(cluster, box: list[int]):
    """Before the run: every worker's cache remembers its blocks; each first admission adds what an
    infinite cache on its worker would have skipped to box[0]."""
    for w in cluster.workers:
        w.cache = EverCache()
    admit = cluster._admit

    def counted(w, req, need):
        if isinstance(req, Request) and not req.cache_queried and req.block_hashes:
            ever, n = w.cache.ever, 0
            for h in req.block_hashes[: (req.prefill_target - 1) // w.block_size]:
                if h not in ever:
                    break
                n += 1
            box[0] += n * w.block_size
        return admit(w, req, need)

    cluster._admit = counted


def run(trace: Trace, policy: str, cache: bool) -> dict:
    box = [0]
    res = simulate(trace, policy, setup(cache), before_run=lambda c: routing_bound(c, box))
    s = res.summary
    queries = sum(w.prefix_cache_queries for w in res.cluster.workers)
    keys = ("completed", "attainment", "strict_attainment", "ttft_p50_s", "ttft_p99_s", "preemptions", "sim_wall_s")
    out = {k: s[k] for k in keys}
    out["hit"] = s["prefix_cache_hit_rate"]
    out["oracle"] = s["prefix_cache_oracle_hit_rate"]
    out["routing_bound"] = hit_rate(box[0], queries) if cache else 0.0
    out["hit_by_worker"] = s["prefix_cache_hit_rate_by_worker"]
    out["computed_prompt_tok_s"] = (1 - out["hit"]) * float(trace.prompt_len.sum()) / trace.duration_s
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(12, 4 * len(results)), squeeze=False)
    x = range(len(POLICIES))
    for row, (name, runs) in zip(axes, results.items()):
        on, off = runs["on"], runs["off"]
        row[0].bar([i - 0.3 for i in x], [on[p]["hit"] for p in POLICIES], 0.3, label="hit rate")
        row[0].bar(x, [on[p]["routing_bound"] for p in POLICIES], 0.3, label="routing bound")
        row[0].bar([i + 0.3 for i in x], [on[p]["oracle"] for p in POLICIES], 0.3, label="oracle")
        row[0].set_title(f"{name}: token hit rate (cache on)")
        row[1].bar([i - 0.2 for i in x], [on[p]["attainment"] for p in POLICIES], 0.4, label="cache on")
        row[1].bar([i + 0.2 for i in x], [off[p]["attainment"] for p in POLICIES], 0.4, label="cache off")
        row[1].set_title(f"{name}: joint SLO attainment")
        for ax in row:
            ax.set_xticks(list(x), POLICIES, rotation=20)
            ax.set_ylim(0, 1)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def turnover(trace: Trace, runs: dict) -> str:
    """Why a cache falls short of its routing bound: how long a worker's cache keeps a block (its KV
    capacity over the prompt tokens it computes per second) against how long a session waits."""
    cap = setup(True).kv_blocks(setup(True).roofline()) * 16
    think = trace.think_time_s[trace.session >= 0] if trace.session is not None else []
    p50 = float(np.percentile(think[think > 0], 50)) if len(think) else float("nan")
    lines = []
    for p in ("chunked", "static-pd"):
        on = runs["on"][p]
        per_worker = on["computed_prompt_tok_s"] / (1 if p == "static-pd" else 4)  # static-pd: 1 prefill worker
        lines.append(f"{p} ~{cap / max(per_worker, 1e-9):.0f} s")
    return (
        f"  cache turnover (KV capacity {cap / 1e3:.0f}k tokens per worker over the prompt tokens it computes): "
        f"{', '.join(lines)}; session think time p50 {p50:.0f} s"
    )


def report(name: str, runs: dict) -> None:
    print(f"\n{name}: hit / routing bound / oracle, TTFT p50 p99 s, joint / strict attainment (cache on | off)")
    for p in POLICIES:
        on, off = runs["on"][p], runs["off"][p]
        print(
            f"  {p:<11} hit {on['hit']:6.1%} / {on['routing_bound']:6.1%} / {on['oracle']:6.1%}"
            f"  TTFT {on['ttft_p50_s']:7.2f} {on['ttft_p99_s']:7.1f} |"
            f" {off['ttft_p50_s']:7.2f} {off['ttft_p99_s']:7.1f}"
            f"  attain {on['attainment']:6.1%} {on['strict_attainment']:6.1%} |"
            f" {off['attainment']:6.1%} {off['strict_attainment']:6.1%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="15-minute windows instead of 30")
    ap.add_argument("--out", type=Path, default=Path("results/sim_prefix_cache"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    wls = workloads(args.quick)
    bar = tqdm(total=len(wls) * len(POLICIES) * 2, desc="sim_prefix_cache", unit="run", file=sys.stderr)
    results: dict = {}
    traces: dict[str, Trace] = {}
    for wl in wls:
        trace = traces[wl.name] = wl.trace()
        runs: dict = {"requests": len(trace), "about": wl.about, "on": {}, "off": {}}
        for p in POLICIES:
            for cache in (True, False):
                bar.set_postfix_str(f"{wl.name} {p} {'on' if cache else 'off'}")
                runs["on" if cache else "off"][p] = run(trace, p, cache)
                bar.update()
        results[wl.name] = runs
    bar.close()
    for wl in wls:
        print(
            f"\n{wl.name}: {wl.about}; window [{wl.start_s:g}, {wl.start_s + wl.duration_s:g}) s, "
            f"{results[wl.name]['requests']} requests"
        )
        report(wl.name, results[wl.name])
        print(turnover(traces[wl.name], results[wl.name]))
    (args.out / "sim_prefix_cache.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    plot(results, args.out / "sim_prefix_cache.png")
    print(f"\nwall {time.perf_counter() - t0:.0f} s; wrote {args.out}/sim_prefix_cache.png and .json")
    parts = []
    for name, runs in results.items():
        best = max(POLICIES, key=lambda p: runs["on"][p]["hit"] / max(runs["on"][p]["oracle"], 1e-9))
        on = runs["on"][best]
        parts.append(
            f"{name}: best hit {on['hit']:.1%} = {on['hit'] / max(on['oracle'], 1e-9):.0%} of oracle {on['oracle']:.1%}"
            f" ({best}); fluidpd attainment {runs['on']['fluidpd']['attainment']:.1%} on vs "
            f"{runs['off']['fluidpd']['attainment']:.1%} off"
        )
    print("; ".join(parts))


if __name__ == "__main__":
    main()
