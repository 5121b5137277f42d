"""The open loop: every request sent at its own arrival offset, whatever the server is doing."""

from __future__ import annotations

import asyncio
import sys
import time

from fluidpd.bench.loadgen.client import send_one
from fluidpd.bench.loadgen.requests import BenchRequest, BenchResult


async def replay(
    client,
    base: str,
    model: str,
    requests: list[BenchRequest],
    *,
    drain_timeout_s: float = 300.0,
    progress: bool = True,
    temperature: float = 0.0,
    retries: int = 0,
) -> tuple[list[BenchResult], float]:
    """Send every request at its arrival offset (open loop); results and the run's wall time."""
    from tqdm import tqdm

    results = [BenchResult(r.index, len(r.prompt_ids), r.max_tokens) for r in requests]
    bar = tqdm(
        total=len(requests),
        desc="bench",
        unit="req",
        file=sys.stderr,
        disable=not progress,
        mininterval=0.5,
        dynamic_ncols=True,
    )
    t0 = time.perf_counter()

    async def run(req: BenchRequest, res: BenchResult) -> None:
        delay = t0 + req.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            await send_one(client, base, model, req, t0, res, temperature, retries)
        finally:
            bar.update(1)
            bar.set_postfix_str(f"failed={sum(1 for r in results if r.error)}", refresh=False)

    tasks = [asyncio.create_task(run(q, r)) for q, r in zip(requests, results)]
    horizon = (requests[-1].arrival_s if requests else 0.0) + drain_timeout_s
    try:
        _, pending = await asyncio.wait(tasks, timeout=horizon) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        bar.close()
    for r in results:
        if r.error is None and r.finish_reason is None:
            r.error = "not finished before the drain timeout"
    return results, time.perf_counter() - t0
