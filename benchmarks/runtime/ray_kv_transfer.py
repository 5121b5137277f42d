"""KV across Ray nodes vs shared memory on one node, and a small trace on `--backend ray` vs processes.

A local two-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on this machine: what crosses
"nodes" here goes through the object store, not a network). Part 0: the two paths the Ray backend
could move KV by, raw bytes of each KV size between probe actors on the two nodes
(`fluidpd.runtime.ray_links.measure_links`): the object store (`ray.put` / `ray.get`) and a
`ray.util.collective` gloo group (send / recv). Part 1: one request holding N tokens
of SmolLM2 KV is handed between two workers, export_kv + the handle + import_kv timed at the
coordinator, median of `--repeats` hops per size: RayWorkers on different nodes through the "ray"
transport (the object store) against ProcessWorkers through shared memory ("shm"). Part 2: the
same small trace (`--requests` prompts of 64..512 tokens, Poisson arrivals) streamed through a
static-pd coordinator of 3 workers on `--backend ray` and on `--backend process`: P50/P99 TTFT
and TBT over all gaps. Figures on the last line.

    .venv/bin/python benchmarks/runtime/ray_kv_transfer.py [--repeats 5] [--tokens 256 1024 2048] [--requests 24]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time

from runtime_common import percentile, prompt, timed

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.base import PolicyConfig
from fluidpd.runtime.backend import make_worker, start_workers
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.ray_links import measure_links
from fluidpd.runtime.ray_worker import RayPlacement
from fluidpd.runtime.transport.ray import require_ray

CONFIG = EngineConfig(num_kv_blocks=256, max_model_len=4096, max_num_seqs=16)
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # SmolLM2: layers x (K, V) x KV heads x head dim x fp32


def hops(workers, via: str | None, tokens: int, repeats: int) -> tuple[float, int]:
    """Median seconds of one hand-off of a `tokens`-token request between the two workers, and its bytes."""
    a, b = workers
    params = SamplingParams(max_tokens=1 << 16, ignore_eos=True)
    rid = a.submit("add_request", f"kv{tokens}", prompt(tokens), params).result()
    a.submit("run_step", StepPlan(prefills=[PrefillChunk(rid, tokens)])).result()
    ts, nbytes = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        h = a.submit("export_kv", rid, True, via).result()
        b.submit("import_kv", h, None, rid).result()
        ts.append(time.perf_counter() - t0)
        nbytes = h.nbytes
        a, b = b, a
    a.submit("abort", rid).result()
    return statistics.median(ts), nbytes


async def trace_run(coord, n: int, seed: int) -> dict:
    rng = random.Random(seed)
    await coord.start()
    try:
        tasks = []
        for i in range(n):
            ids = prompt(rng.randint(64, 512), seed=i)
            tasks.append(asyncio.create_task(timed(coord, f"t{i}", ids, 32)))
            await asyncio.sleep(rng.expovariate(1.0))
        rows = await asyncio.gather(*tasks)
    finally:
        await coord.stop()
    ttft = [r["ttft"] for r in rows]
    gaps = [g for r in rows for g in r["gaps"]]
    return {"ttft_p50": percentile(ttft, 0.5), "ttft_p99": percentile(ttft, 0.99),
            "tbt_p50": percentile(gaps, 0.5), "tbt_p99": percentile(gaps, 0.99)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--requests", type=int, default=24)
    args = ap.parse_args()
    ray = require_ray()
    from ray.cluster_utils import Cluster

    tmp = os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="fpr-")  # Ray's socket paths must stay short
    os.makedirs(os.path.join(tmp, "ray"))
    node = {"num_cpus": 2, "object_store_memory": 256 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        placement = RayPlacement.create(2)
        paths: dict[str, dict[int, float]] = {}
        for n in args.tokens:
            nbytes = n * KV_BYTES_PER_TOKEN
            links = measure_links(placement.group, nbytes, args.repeats, collective=True)
            for path, b in links.bandwidth.items():
                paths.setdefault(path, {})[n] = b
            print(f"raw {n:5d} tokens ({nbytes / 1e6:.1f} MB) between the nodes: " + ", ".join(
                f"{k} {v / 1e9:.2f} GB/s" for k, v in links.bandwidth.items()))  # fmt: skip
        pairs = {
            "ray (object store, across nodes)": ([make_worker("ray", i, CONFIG, placement=placement) for i in (0, 1)],
                                                 "ray"),
            "shm (processes, one node)": ([make_worker("process", i, CONFIG) for i in (0, 1)], None),
        }  # fmt: skip
        bw: dict[str, dict[int, float]] = {}
        for name, (workers, via) in pairs.items():
            start_workers(workers)
            try:
                if via:
                    assert workers[0].node_id != workers[1].node_id, "the two actors landed on one node"
                for n in args.tokens:
                    s, nbytes = hops(workers, via, n, args.repeats)
                    bw.setdefault(name, {})[n] = nbytes / s
                    gbs = nbytes / s / 1e9
                    print(f"{name:34} {n:5d} tokens: {nbytes / 1e6:7.1f} MB in {s * 1e3:7.1f} ms = {gbs:.2f} GB/s")
            finally:
                for w in workers:
                    w.close()
        ray.util.remove_placement_group(placement.group)
        e2e = {}
        for backend in ("ray", "process"):
            runtime = RuntimeConfig(workers=3, policy="static-pd", backend=backend, heartbeat_timeout_s=5.0,
                                    admit_ttft_factor=0.0, scheduling=PolicyConfig(prefill_workers=1),
                                    profile_cache=False)  # fmt: skip
            coord = build_coordinator(CONFIG, runtime, log=lambda m: None)
            e2e[backend] = asyncio.run(trace_run(coord, args.requests, seed=7))
            r = e2e[backend]
            print(f"--backend {backend:8} TTFT p50 {r['ttft_p50']:.3f} s p99 {r['ttft_p99']:.3f} s; "
                  f"TBT p50 {r['tbt_p50'] * 1e3:.1f} ms p99 {r['tbt_p99'] * 1e3:.1f} ms")  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()
    big = max(args.tokens)
    across, local = (bw[name][big] for name in bw)
    store, gloo = paths["object_store"][big], paths["gloo"][big]
    print(
        f"headline: raw {big}-token KV between nodes: object store {store / 1e9:.2f} GB/s, gloo "
        f"{gloo / 1e9:.2f} GB/s ({gloo / store:.2f}x); "
        f"KV at {big} tokens {across / 1e9:.2f} GB/s across Ray nodes vs {local / 1e9:.2f} "
        f"GB/s over shared memory ({across / local:.2f}x); TTFT p50 ray/process "
        f"{e2e['ray']['ttft_p50'] / e2e['process']['ttft_p50']:.2f}x, TBT p50 "
        f"{e2e['ray']['tbt_p50'] / e2e['process']['tbt_p50']:.2f}x"
    )


if __name__ == "__main__":
    main()
