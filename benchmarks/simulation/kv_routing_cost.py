"""What one KV-affinity routing decision costs at 64 workers, against load-only routing.

Setting: 64 workers of Llama-3.1-8B on H100 (TP 1), 16 prefill and 48 decode, each holding the
contexts of many agent sessions in its cache (Claude Code-sized: 8k to 120k tokens, block size 16),
with a few queued prompts each. Each decision routes the next turn of a random session (its context
cached on one decode worker and, as a prompt, on one prefill worker). Decisions timed in batches;
median of batch medians, in microseconds per decision: fluidpd's kv-affinity (predicted TTFT over
every prefill worker and the decode worker holding the context) vs static-pd's shortest-queue and
SGLang's cache-aware router on the same cluster state.

    .venv/bin/python benchmarks/simulation/kv_routing_cost.py [--decisions N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace

from tqdm import tqdm

from fluidpd.core.metrics import Slo
from fluidpd.core.request import Request
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.registry import make_policy
from fluidpd.policy.view import Role
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, prefill_saturation_tokens
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.world.worker import WorkerState

N_WORKERS, N_PREFILL, BS = 64, 16, 16
SESSIONS_PER_WORKER = 4


class View:
    """A ClusterView over fixed workers."""

    def __init__(self, workers):
        self.workers, self.now = workers, 0.0


def session(sid: int, tokens: int) -> list[int]:
    return [(sid << 20) | i for i in range(tokens // BS)]


def park(w: WorkerState, rid: int, hashes: list[int]) -> None:
    """Leave `hashes` cached on `w` as a finished turn does."""
    r = Request(rid, 0.0, len(hashes) * BS, 1, block_hashes=hashes)
    w.allocate(len(hashes))
    w.register(r, len(hashes) * BS)
    w.release(r, len(hashes), len(hashes) * BS)


def cluster(rng: random.Random, blocks: int) -> tuple[list[WorkerState], dict[int, list[int]]]:
    roles = [Role.PREFILL] * N_PREFILL + [Role.DECODE] * (N_WORKERS - N_PREFILL)
    ws = [WorkerState(i, r, 0, blocks, BS) for i, r in enumerate(roles)]
    contexts: dict[int, list[int]] = {}
    for d in ws[N_PREFILL:]:
        for _ in range(SESSIONS_PER_WORKER):
            sid = len(contexts)
            contexts[sid] = session(sid, rng.randint(8_000, 120_000))
            park(d, 10 * sid, contexts[sid])
            park(ws[rng.randrange(N_PREFILL)], 10 * sid + 1, contexts[sid][:-2])
    for w in ws[:N_PREFILL]:
        for i in range(rng.randint(0, 4)):
            w.enqueue(Request(1_000_000 + 100 * w.id + i, 0.0, rng.randint(500, 20_000), 100))
    return ws, contexts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=2000)
    args = ap.parse_args()
    if args.decisions < 100:
        ap.error("--decisions must be >= 100")
    rng = random.Random(0)
    setup = Setup(get_model("llama-3.1-8b", "bf16"), get_hardware("h100"), Slo(5.0, 0.04), SimConfig(n_workers=64))
    roofline = setup.roofline()
    ws, contexts = cluster(rng, setup.kv_blocks(roofline))
    view = View(ws)
    base = replace(PolicyConfig(), prefill_workers=N_PREFILL, prefill_batch_tokens=prefill_saturation_tokens(roofline))
    routers = {
        "fluidpd+kv-affinity": make_policy("fluidpd", base, costs=setup.costs(roofline)),
        "static-pd+shortest-queue": make_policy("static-pd", base),
        "static-pd+sglang-cache-aware": make_policy("static-pd", replace(base, router="sglang-cache-aware")),
    }
    turns = [
        Request(i, 0.0, len(c) * BS + 300, 200, block_hashes=c + [(1 << 40) + i] * 18)
        for i, c in ((i, contexts[rng.randrange(len(contexts))]) for i in range(args.decisions))
    ]
    batch = 50
    us: dict[str, float] = {}
    bar = tqdm(total=len(routers) * len(turns), desc="decisions", file=sys.stderr)
    for name, pol in routers.items():
        per = []
        for i in range(0, len(turns), batch):
            t0 = time.perf_counter()
            for req in turns[i : i + batch]:
                pol.route(req, view)
            per.append((time.perf_counter() - t0) / batch * 1e6)
            bar.update(batch)
        us[name] = statistics.median(per)
    bar.close()
    kv = routers["fluidpd+kv-affinity"]
    print(f"decode workers chose (on the decode worker holding the context): {kv.affinity.on_decode} of {len(turns)}")
    for name, v in us.items():
        print(f"  {name:<30} {v:8.1f} us per decision")
    sq = us["static-pd+shortest-queue"]
    print(
        f"kv-affinity routing at {N_WORKERS} workers: {us['fluidpd+kv-affinity']:.0f} us per decision "
        f"({us['fluidpd+kv-affinity'] / sq:.1f}x shortest-queue's {sq:.0f} us)"
    )


if __name__ == "__main__":
    main()
