"""The serving runtime's per-step overhead: plans sent to a worker process and timed there and back."""

from __future__ import annotations

import time
from statistics import median

from fluidpd.bench.host_profile.step_bench import with_blocks


def measure_dispatch(engine_config, repeats: int, threads: int = 1, tokens: int = 256) -> dict:
    """The serving runtime's overhead per step: a worker process of the process backend runs
    decode steps (batch 1 and 8, `tokens` of context each) and `tokens`-token prefills sent from
    here; the wall time from sending the plan to having its result, less the engine's own step
    time (pickling, the pipe, threads). The worker runs `threads` torch threads."""
    from fluidpd.engine.plan import PrefillChunk, StepPlan
    from fluidpd.engine.sampling import SamplingParams
    from fluidpd.runtime.backend import make_worker

    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    # 8 x `tokens` decoding + a prefill (at least 256 blocks)
    worker = make_worker("process", 0, with_blocks(engine_config, max(256, tokens)), num_threads=threads)
    try:
        worker.start()

        def overhead(plan) -> float:
            t0 = time.perf_counter()
            res = worker.submit("run_step", plan).result()
            return time.perf_counter() - t0 - res.step_s

        ids = [worker.submit("add_request", f"d{i}", list(range(100, 100 + tokens)), params).result() for i in range(8)]
        for rid in ids:
            worker.submit("run_step", StepPlan(prefills=[PrefillChunk(rid, tokens)])).result()
        decode = [overhead(StepPlan(decodes=ids[:b])) for b in (1, 8) for _ in range(repeats)]
        prefill = []
        for i in range(repeats):
            rid = worker.submit("add_request", f"p{i}", list(range(200, 200 + tokens)), params).result()
            prefill.append(overhead(StepPlan(prefills=[PrefillChunk(rid, tokens)])))
            worker.submit("abort", rid).result()
        return {"decode_s": median(decode), "prefill_s": median(prefill), "steps": len(decode) + len(prefill)}
    finally:
        worker.close()
